// Small AVX2 helpers shared by the native kernels. Every helper is one fixed instruction sequence, so a
// result depends only on its inputs (the kernels' batch invariance rests on that).
#pragma once
#include <immintrin.h>
#ifdef SPECDEC_LIGHT  // a translation unit of plain arithmetic (gguf_core.h): half a minute less to compile
#include <c10/util/Half.h>
#else
#include <torch/extension.h>
#endif

#include <ATen/Parallel.h>
#include <omp.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace specdec {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);                 // 4 lanes
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));        // 2 lanes
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));  // 1 lane
  return _mm_cvtss_f32(s);
}

inline __m256 load_w(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// e^x for 8 floats: range reduction by ln 2 and a degree-5 polynomial (Cephes' expf), ~1 ulp. The same
// instruction sequence for every lane and call, so results depend only on x. attention.cpp's exp512 repeats it on 16
// lanes for the AVX-512 softmax: a change here is made there too, or the two builds' bits part.
inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505531f);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

// f(r0, r1) over rows [0, R): split between the threads for a prefill's many rows, on the caller's thread for a
// decode or verify pass's few (a thread's start costs more than their work). Each row's result is computed by the
// same code whichever thread runs it, so this never changes a value.
template <class F>
void over_rows(int64_t R, F f) {
  if (R >= 16) at::parallel_for(0, R, 8, f);
  else f(0, R);
}

// A thread's place in a team (team() below): thread t of T.
struct Team {
  int64_t t, T;
  // Every thread of the team waits here until all have arrived. A team of one never waits: called inside another
  // parallel region, a barrier would bind to that region's team.
  void sync() const {
    if (T > 1) {
#pragma omp barrier
    }
  }
  // This thread's contiguous share of [0, n) (the first n % T threads take one more).
  std::pair<int64_t, int64_t> share(int64_t n) const {
    const int64_t base = n / T, extra = n % T, lo = t * base + std::min(t, extra);
    return {lo, lo + base + (t < extra ? 1 : 0)};
  }
};

// f(team) on every thread of one OpenMP team (torch's thread count; a team of one inside another parallel region),
// so that a kernel's steps can meet at team.sync() rather than each step starting and joining threads of its own.
// Every thread runs f and reaches the same barriers, whether its share is empty or not. f must not throw: every
// check happens before the team starts.
template <class F>
void team(F f) {
  if (at::get_num_threads() <= 1 || omp_in_parallel()) return f(Team{0, 1});
#pragma omp parallel
  f(Team{omp_get_thread_num(), omp_get_num_threads()});
}

// f(i0, i1) over items [0, n): split between a team's threads once there are at least `team_from` of them, on the
// caller's thread below that (a team's start, about half a microsecond, costs more than a few rows' elementwise
// work). Each item's result is computed by the same code whoever runs it, so this never changes a value.
template <class F>
void over_items(int64_t n, int64_t team_from, F f) {
  if (n < team_from) return f(int64_t(0), n);
  team([&](const Team& tm) {
    const auto [i0, i1] = tm.share(n);
    if (i0 < i1) f(i0, i1);
  });
}

// A machine's peak rate of some arithmetic: every thread runs `thread_rate(seconds)` at once, which returns that
// thread's operations per second; the sum over threads. The peaks of decode_f16.cpp and gguf.cpp use it.
template <class ThreadRate>
double over_threads(double seconds, ThreadRate thread_rate) {
  std::vector<double> rate(at::get_num_threads(), 0.0);
  at::parallel_for(0, int64_t(rate.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rate[t] = thread_rate(seconds);
  });
  double total = 0;
  for (double r : rate) total += r;
  return total;
}

// Runs `batch` steps at a time until `seconds` have passed; returns steps per second.
template <class Step>
double steps_per_second(double seconds, int64_t batch, Step step) {
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  double el = 0;
  do {
    for (int64_t s = 0; s < batch; ++s) step();
    done += batch;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (el < seconds);
  return done / el;
}

// attention.cpp: the fp16 KV cache and attention over it (layout and invariance described there).
constexpr int64_t KB = 64;  // positions per key block (the Python side's KV_BLOCK)
// Whether attention's tiles run in 512-bit registers (bit-identical to the AVX2 tiles): where the CPU has AVX-512F,
// unless gguf.cpp's set_isa("avx2") asks for the AVX2 builds throughout.
extern bool wide;
bool cpu_has_avx512();
// Whether a q8_0 cache's prefill tiles run on AMX (attention_amx.inc): set by gguf.cpp where the CPU has AMX-INT8 and
// this process may use it, unless set_isa asks for another build.
extern bool amx_tiles;
// The cache's type: fp16, or llama.cpp's q8_0 / q4_0 blocks (attention_q.inc), kept as bytes in blocks of KB
// positions, kv_block_bytes(kind, d) a head's block, for keys and for values.
enum class Kv : int { F16 = 0, Q8 = 1, Q4 = 2 };
int64_t kv_block_bytes(Kv kind, int64_t d);
std::vector<std::string> kv_type_names();  // the types the kernels run on this CPU
void store_kv(const float* k, const float* v, at::Half* kc, at::Half* vc, int64_t slot, int64_t g, int64_t p,
              int64_t hk, int64_t cap, int64_t d);
void store_kv_q(const float* k, const float* v, uint8_t* kc, uint8_t* vc, Kv kind, int64_t slot, int64_t g,
                int64_t p, int64_t hk, int64_t cap, int64_t d);
void attention(const float* qkv, int64_t qstride, const int64_t* slot, const int64_t* pos, int64_t R,
               const void* kc, const void* vc, Kv kind, int64_t hq, int64_t hk, int64_t cap, int64_t d, float scale,
               int64_t window, float* out, float softcap = 0.f);

#ifndef SPECDEC_LIGHT
// decode_f16.cpp: the parts of a decoder block that do not depend on how its weights are stored.
enum Product { QKV = 0, O = 1, GATE_UP = 2, DOWN = 3 };
// y [M, N] = x [M, K] . W^T for the block's product `which` (N and K are the weights').
using LinearFn = std::function<void(int which, const float* x, float* y, int64_t M)>;
// What a Gemma 3 block adds to a Llama one (models/gemma3.py); the defaults are a Llama block. Norm weights are
// the multipliers themselves (Gemma's 1 + w, stored so).
struct BlockVariant {
  const float* q_norm = nullptr;          // [d]: an RMSNorm on each query head before RoPE
  const float* k_norm = nullptr;          // [d]: and on each key head
  const float* post_attn_norm = nullptr;  // [H]: on the attention output, before its residual add
  const float* post_ff_norm = nullptr;    // [H]: on the MLP output, before its residual add
  bool gelu = false;                      // GELU (tanh approximation) of the gate, not SiLU
  float scale = 0.f;                      // the attention scores' scale; 0: head_dim^-1/2
  int64_t window = 0;                     // a query sees this many keys, its own included; 0: all before it
  float softcap = 0.f;                    // Gemma 2: scaled scores s become softcap * tanh(s / softcap); 0: none
  // A mixture of experts in place of the MLP (gguf.cpp's MoeLayer): out [R, H] from the normed rows h [R, H]
  std::function<void(const float* h, float* out, int64_t R)> moe;
};
void decoder_block(torch::Tensor x, torch::Tensor slot, torch::Tensor pos, torch::Tensor norm1, torch::Tensor norm2,
                   int64_t inter, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos, torch::Tensor sin,
                   int64_t hq, int64_t hk, double eps, const LinearFn& lin, const BlockVariant& variant = {});
void rms_norm_rows(const float* x, const float* w, float* out, int64_t R, int64_t H, float eps);
void f32_slab(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
              int64_t s0, int64_t s1);

// gguf.cpp: products on a GGUF's quantized blocks, added to the module by decode_f16.cpp's module definition.
void register_gguf(pybind11::module& m);
#endif

}  // namespace specdec
