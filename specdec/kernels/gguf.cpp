// Matrix products on a GGUF's own quantized blocks (Q4_0, Q4_1, Q8_0: 32 weights a block), for decode, verify
// and prefill passes, and the decoder block built on them.
//
// Two arithmetic paths:
//   exact  the weights dequantized as llama.cpp and gguf-py define them (w = d q + m in fp32: d q is exact, one
//          rounding for + m) against fp32 activations: the fp32 model's FMA chain on the file's weights.
//   q8     each activation row quantized in blocks of 32 (int8, one scale d_a = max|x| / 127 a block, and
//          s_a = d_a * sum(q_a)), then integer dot products: vpmaddubsw + vpmaddwd give 32 multiply-adds in two
//          instructions where fp32 needs four FMAs. y = sum_b d_w d_a (q_w . q_a) + sum_b m_w s_a.
//   q16    the same with 15-bit activation blocks: Q = round(128 x 127 / max|x|), held as two int8 planes
//          Q = 128 q1 + q2 (q1 = round(x 127 / max|x|), |q2| <= 64), so each block costs two q8 dot products.
//          Its activations are 128x finer than q8's: top-1 agreement with the fp32 model 0.9992 against q8's
//          0.97 (docs/results/quality-gguf.md), at twice q8's arithmetic, which a one-row pass hides under the
//          weights' memory traffic.
// Batch invariance: every (row, output) result is one fixed chain over the blocks in ascending order, and
// activations are quantized per row and per block, so no result depends on the other rows or on the tiling.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "common.h"
#include "gguf_core.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

using namespace specdec::gguf;

namespace {

using specdec::hsum;

// A weight matrix (its layout in gguf_core.h) and the tensors that hold its planes.
struct QMatrix : QView {
  torch::Tensor q, d, m, hb, sc;  // hb, sc: gguf_kq.inc's high-bit and integer-scale planes
  // A matrix stacked by rows from parts of different types (a fused [q; k; v] whose v is Q6_K while q and k are Q4_K,
  // as in Q4_K_M files): each part computes its own columns of y.
  std::vector<const QMatrix*> parts;
  pybind11::list keep;  // the parts' Python objects, kept alive with this one
  QMatrix(int64_t bits, int64_t N, int64_t K, torch::Tensor q, torch::Tensor d, c10::optional<torch::Tensor> m,
          bool rows, int64_t act_bits, bool paired, c10::optional<torch::Tensor> hb, c10::optional<torch::Tensor> sc,
          int64_t scales)
      : QView{bits, N, K, rows ? N : (N + 7) / 8, K / QB, rows, act_bits, paired, scales},
        q(q.contiguous()), d(d.contiguous()) {
    TORCH_CHECK(act_bits == 8 || act_bits == 16, "act_bits must be 8 or 16");
    TORCH_CHECK(K % QB == 0 && N > 0, "K must be a multiple of 32");
    TORCH_CHECK(!paired || !rows, "only interleaved blocks are stored in pairs");
    TORCH_CHECK(this->q.element_size() == 1, "q: uint8 or int8");
    TORCH_CHECK(this->d.dtype() == torch::kHalf, "d: fp16");
    if (kq()) {
      check_kq(m, hb, sc);
    } else {
      TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8 (or 5, 6 with scales, see gguf_kq.inc)");
      const int64_t per = rows ? 1 : 8;  // rows per group
      const int64_t stored = paired ? G + G % 2 : G;  // groups held, the pair's padding included
      TORCH_CHECK(this->q.numel() == stored * B * per * (bits == 4 ? 16 : 32), "q: 16 or 32 bytes a row and block");
      TORCH_CHECK(this->d.numel() == stored * B * per, "d: fp16, one a row and block");
      if (bits == 4) {
        TORCH_CHECK(m.has_value(), "4-bit blocks need their minimums");
        this->m = m->contiguous();
        TORCH_CHECK(this->m.dtype() == torch::kHalf && this->m.numel() == this->d.numel(), "m: fp16 like d");
        mp_ = this->m.data_ptr<at::Half>();
      }
    }
    qp_ = static_cast<const uint8_t*>(this->q.data_ptr());  // raw pointers taken once: data_ptr() costs checks
    dp_ = this->d.data_ptr<at::Half>();
  }
  explicit QMatrix(const pybind11::list& stacked)
      : QView{0, 0, 0, 0, 0, false, 8, false}, keep(stacked) {
    for (const auto& item : stacked) {
      const QMatrix* p = &item.cast<const QMatrix&>();
      TORCH_CHECK(p->parts.empty(), "a part cannot itself have parts");
      TORCH_CHECK(parts.empty() || (p->K == K && p->rows == rows && p->act_bits == act_bits),
                  "parts share K and the arithmetic path");
      K = p->K; B = p->B; rows = p->rows; act_bits = p->act_bits;
      N += p->N;
      parts.push_back(p);
    }
    TORCH_CHECK(!parts.empty(), "a stacked matrix needs parts");
  }
  void check_kq(const c10::optional<torch::Tensor>& m, const c10::optional<torch::Tensor>& hb,
                const c10::optional<torch::Tensor>& sc) {
    TORCH_CHECK(!rows, "5- and 6-bit and K-quant blocks are interleaved");
    const int64_t want = bits * 10 + scales;
    TORCH_CHECK(want == 50 || want == 41 || want == 51 || want == 62,
                "formats: bits 5 scales 0 (Q5_0, Q5_1), bits 4 or 5 scales 1 (Q4_K, Q5_K), bits 6 scales 2 (Q6_K)");
    TORCH_CHECK(scales == 0 || K % 256 == 0, "K-quant rows are whole super-blocks of 256");
    const int64_t S = paired ? G + G % 2 : G;  // groups stored, a pair's padding included
    TORCH_CHECK(q.numel() == S * B * 128, "q: the low nibbles, 128 bytes a group and block");
    const int64_t per_scale = scales == 0 ? S * B * 8 : S * (B / 8) * 8;
    TORCH_CHECK(d.numel() == per_scale, "d: 8 fp16 a group and block (super-block for K-quants)");
    if (scales != 2) {
      TORCH_CHECK(m.has_value() && m->dtype() == torch::kHalf && m->numel() == per_scale, "m: fp16 like d");
      this->m = m->contiguous();
      mp_ = this->m.data_ptr<at::Half>();
    }
    if (bits > 4) {
      TORCH_CHECK(hb.has_value() && hb->element_size() == 1 && hb->numel() == S * B * 32 * (bits - 4),
                  "hb: 32 bytes a group and block for each bit above 4");
      this->hb = hb->contiguous();
      hp_ = static_cast<const uint8_t*>(this->hb.data_ptr());
    }
    if (scales != 0) {
      TORCH_CHECK(sc.has_value() && sc->element_size() == 1 && sc->numel() == S * B * 16,
                  "sc: 16 bytes a group and block");
      this->sc = sc->contiguous();
      sp_ = static_cast<const uint8_t*>(this->sc.data_ptr());
    }
  }
  int64_t nbytes() const {
    int64_t n = 0;
    for (const QMatrix* p : parts) n += p->nbytes();
    for (const torch::Tensor* t : {&q, &d, &m, &hb, &sc})
      if (t->defined()) n += t->numel() * t->element_size();
    return n;
  }
};

#include "gguf_pack.inc"

// ---- exact: the file's weights, fp32 arithmetic ----------------------------------------------------------
// Each weight is dequantized as gguf-py and llama.cpp define it, w = d q + m in fp32 (d q is exact, so one
// rounding), and multiplied by the fp32 activations: per (row, output) one 8-lane FMA chain over k in ascending
// order, then hsum -- the fp32 model's chain on the same weights. A few rows: weights dequantized 8 at a time in
// registers and used by every activation row. Many rows (prefill): a slab dequantized into an L2 buffer and
// multiplied by decode_f16.cpp's fp32 tiles, which run the same chain.

// The 32 weights of row n, block b, as 4 fp32 registers (elements 0-7, 8-15, 16-23, 24-31).
inline void dequant_block(const QMatrix& W, int64_t n, int64_t b, __m256 w[4]) {
  const int64_t i = n * W.B + b;
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(W.dp_[i].x));
  if (W.bits == 4) {  // byte j holds element j (low nibble) and j + 16 (high)
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(W.mp_[i].x));
    const uint8_t* p = W.qp_ + i * 16;
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i low = _mm256_set1_epi32(0x0F);
    const __m256i q[4] = {_mm256_and_si256(lo, low), _mm256_and_si256(hi, low), _mm256_srli_epi32(lo, 4),
                          _mm256_srli_epi32(hi, 4)};
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m);
  } else {
    const int8_t* p = reinterpret_cast<const int8_t*>(W.qp_) + i * 32;
    for (int k = 0; k < 4; ++k)
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k)))), d);
  }
}

// Weight rows [n, n + NB) against activation rows [m0, m0 + MB): NB independent chains per row keep the FMA
// latency hidden when there are few rows.
template <int MB, int NB>
inline void exact_tile(const float* x, const QMatrix& W, float* y, int64_t m0, int64_t n) {
  const int64_t K = W.K;
  __m256 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < W.B; ++b)
    for (int j = 0; j < NB; ++j) {
      __m256 w[4];
      dequant_block(W, n + j, b, w);
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < MB; ++i)
          acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (m0 + i) * K + b * QB + 8 * k), w[k], acc[i][j]);
    }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[(m0 + i) * W.N + n + j] = hsum(acc[i][j]);
}

template <int MB>
void exact_span(const float* x, const QMatrix& W, float* y, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int NB = MB <= 2 ? 4 : 1;
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) exact_tile<MB, NB>(x, W, y, m0, n);
  for (; n < n1; ++n) exact_tile<MB, 1>(x, W, y, m0, n);
}

void exact_rows(const float* x, const QMatrix& W, float* y, int64_t M, int64_t n0, int64_t n1) {
  if (M <= 16) {  // slabs of weight rows that stay in L1 while every 6 activation rows use them
    constexpr int MB = 6;
    const int64_t row_bytes = W.B * (W.bits == 4 ? 20 : 34);
    const int64_t slab = M <= MB ? n1 - n0 : std::max<int64_t>(1, (int64_t(16) << 10) / row_bytes);
    for (int64_t s0 = n0; s0 < n1; s0 += slab) {
      const int64_t s1 = std::min(n1, s0 + slab);
      int64_t m0 = 0;
      for (; m0 + MB <= M; m0 += MB) exact_span<MB>(x, W, y, m0, s0, s1);
      switch (M - m0) {
        case 5: exact_span<5>(x, W, y, m0, s0, s1); break;
        case 4: exact_span<4>(x, W, y, m0, s0, s1); break;
        case 3: exact_span<3>(x, W, y, m0, s0, s1); break;
        case 2: exact_span<2>(x, W, y, m0, s0, s1); break;
        case 1: exact_span<1>(x, W, y, m0, s0, s1); break;
        default: break;
      }
    }
    return;
  }
  const int64_t slab = std::max<int64_t>(2, 65536 / W.K);  // 256 KB of fp32 weights
  std::vector<float> buf(slab * W.K);
  for (int64_t s0 = n0; s0 < n1; s0 += slab) {
    const int64_t s1 = std::min(n1, s0 + slab);
    for (int64_t n = s0; n < s1; ++n)
      for (int64_t b = 0; b < W.B; ++b) {
        __m256 w[4];
        dequant_block(W, n, b, w);
        for (int k = 0; k < 4; ++k) _mm256_storeu_ps(buf.data() + (n - s0) * W.K + b * QB + 8 * k, w[k]);
      }
    specdec::f32_slab(x, buf.data(), nullptr, y, M, W.N, W.K, s0, s1);
  }
}

// ---- the q8 path's interleaved layout --------------------------------------------------------------------

// ---- q8: int8 activation blocks, integer dot products ----------------------------------------------------

// Sized for M rows of K values, before any thread quantizes into it.
void size_rows(int64_t M, int64_t K, bool q16, Q8Rows& a) {
  a.M = M; a.K = K; a.B = K / QB; a.P = q16 ? 2 : 1;
  a.q.resize(M * K * a.P); a.d.resize(M * a.B); a.s.resize(M * a.B); a.qsum.resize(M * a.B);
  a.qlo.resize(M * a.B);
}

// Blocks [b0, b1) of every row (a thread's share; a block's result does not depend on who computes it). Each row
// and block of 32: d = max|x| / 127, v = x (127 / max|x|) in fp32, q = round(v) (half to even); q16 also
// Q = round(128 v) = 128 q + q2 (128 v - 128 q is exact, so q2 = round(128 (v - q)), |q2| <= 64).
void quantize_blocks(const float* x, int64_t b0, int64_t b1, bool q16, Q8Rows& a) {
  const int64_t K = a.K;
  const __m256 r128 = _mm256_set1_ps(128.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t r = 0; r < a.M; ++r)
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + r * K + b * QB;
      __m256 v[4], mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4), d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i qi[4], q2[4], Q[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 vi = _mm256_mul_ps(v[i], id);
        const __m256 qf = _mm256_round_ps(vi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        qi[i] = _mm256_cvtps_epi32(qf);
        if (q16) {
          q2[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(vi, qf), r128),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
          Q[i] = _mm256_add_epi32(_mm256_slli_epi32(qi[i], 7), q2[i]);
        }
      }
      const __m256i* sq = q16 ? Q : qi;
      const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(sq[0], sq[1]), _mm256_add_epi32(sq[2], sq[3]));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
      s4 = _mm_hadd_epi32(s4, s4);
      s4 = _mm_hadd_epi32(s4, s4);
      const __m256i lo32 = _mm256_add_epi32(sq[0], sq[1]);  // elements 0-15
      __m128i l4 = _mm_add_epi32(_mm256_castsi256_si128(lo32), _mm256_extracti128_si256(lo32, 1));
      l4 = _mm_hadd_epi32(l4, l4);
      l4 = _mm_hadd_epi32(l4, l4);
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
      int8_t* out = a.q.data() + (b * a.M + r) * a.P * QB;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(packed, perm));
      if (q16) {
        const __m256i p2 = _mm256_packs_epi16(_mm256_packs_epi32(q2[0], q2[1]), _mm256_packs_epi32(q2[2], q2[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + QB), _mm256_permutevar8x32_epi32(p2, perm));
      }
      const float unit = q16 ? d * (1.0f / 128.0f) : d;  // exact: a power of two
      const int64_t at = b * a.M + r;
      a.d[at] = unit;
      a.qsum[at] = _mm_cvtsi128_si32(s4);
      a.qlo[at] = _mm_cvtsi128_si32(l4);
      a.s[at] = unit * float(a.qsum[at]);
    }
}

// The integer kernels' builds, compiled in translation units of their own (gguf_avx2.cpp, gguf_vnni.cpp).
namespace avx2 = specdec::gguf::avx2;
namespace vnni = specdec::gguf::vnni;
namespace amx = specdec::gguf::amx;

bool cpu_has_vnni() {
  __builtin_cpu_init();  // use_vnni below is set while the module loads, maybe before libgcc's own constructor
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}
bool use_vnni = cpu_has_vnni();  // set_isa() overrides it (tests compare the builds)

// AMX-INT8 on the CPU, and its tile data granted to this process: Linux hands AMX's 8 KB of state to a process only
// when it asks (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), and a tile instruction without it kills the process.
bool cpu_has_amx() {
  static const bool granted = [] {
    __builtin_cpu_init();
    if (!cpu_has_vnni() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}
bool use_amx = specdec::amx_tiles = cpu_has_amx();  // the products' tiles, and attention's (attention_amx.inc)

// Rows from which a q16 pass's products run on AMX (on weights stored in pairs): below it, the VNNI build's are faster
// (measured in gguf_amx.inc).
constexpr int64_t AMX_MIN_ROWS = 5;
// ... and a K-quant's (Q4_K, Q5_K, Q5_0, Q5_1; Q6_K stays on VNNI), whose tiles take whole tiles of 8 rows and leave
// the rest to the VNNI build: each block is unpacked into a B tile, which pays only on many rows. Alternated in one
// process on an Intel Xeon (scripts/amx_bench.py, the 1B Q4_K_M shape, context 256), whole passes on AMX over VNNI:
// 5, 6 and 8 rows 0.99 to 1.06x (none faster), 9 rows (a tile and a row alone on AMX) 1.13x, 16 rows 0.92 to 0.94x,
// 64 rows 0.89 and 0.90x, prefills of 128 and 512 tokens 0.85 to 0.87x (docs/results/amx-kquants.md).
constexpr int64_t KQ_AMX_MIN_ROWS = 16;
// ... and a q8 pass's (one activation plane, gguf_amx.inc's amx_rows8): tiles of 16 rows, for prefill's chunks.
constexpr int64_t AMX8_MIN_ROWS = 16;

// The layout decides the arithmetic: row layout -> exact, interleaved -> q8.
void matmul(const float* x, const QMatrix& W, float* y, int64_t M);

// A stacked matrix: each part into a buffer, then into its columns of y [M, N].
void matmul_parts(const float* x, const QMatrix& W, float* y, int64_t M) {
  static thread_local std::vector<float> buf;
  int64_t n0 = 0;
  for (const QMatrix* p : W.parts) {
    buf.resize(M * p->N);
    matmul(x, *p, buf.data(), M);
    for (int64_t r = 0; r < M; ++r) std::copy_n(buf.data() + r * p->N, p->N, y + r * W.N + n0);
    n0 += p->N;
  }
}

void matmul(const float* x, const QMatrix& W, float* y, int64_t M) {
  if (!W.parts.empty()) return matmul_parts(x, W, y, M);
  const bool q8 = !W.rows, q16 = q8 && W.act_bits == 16;
  static thread_local Q8Rows mine;  // its vectors only grow: a pass allocates nothing
  Q8Rows& a = mine;  // the caller's, by reference: in a worker thread `mine` would name the worker's own
  if (q8) size_rows(M, W.K, q16, a);
  const int64_t unit = W.paired ? 2 : 1;  // groups per unit of work: a thread's share starts on a pair
  const int64_t units = (W.G + unit - 1) / unit;
  // One team does both steps: each thread quantizes a share of the activations' blocks, and after a barrier
  // multiplies its share of the weight groups. Quantized by the calling thread alone, the activations had kept the
  // other threads waiting: about 5% of a 6-row pass. One row's blocks cost less than the barrier: the caller
  // quantizes them before the team starts.
  const bool shared = q8 && M >= 2;
  if (q8 && !shared) quantize_blocks(x, 0, a.B, q16, a);
  specdec::team([&](const specdec::Team& team) {
    if (shared) {
      const auto [b0, b1] = team.share(a.B);
      quantize_blocks(x, b0, b1, q16, a);
      team.sync();
    }
    const auto [u0, u1] = team.share(units);
    const int64_t g0 = u0 * unit, g1 = std::min(W.G, u1 * unit);  // groups of weight rows for this thread
    if (g0 >= g1) return;
    if (W.kq()) {
      if (q16 && use_amx && W.paired && M >= KQ_AMX_MIN_ROWS) amx::kq_amx_rows(a, W, y, g0, g1);
      else if (q16) use_vnni ? vnni::kq_rows<true>(a, W, y, g0, g1) : avx2::kq_rows<true>(a, W, y, g0, g1);
      else use_vnni ? vnni::kq_rows<false>(a, W, y, g0, g1) : avx2::kq_rows<false>(a, W, y, g0, g1);
    } else if (q16 && use_amx && W.paired && M >= AMX_MIN_ROWS) amx::amx_rows(a, W, y, g0, g1);
    else if (q8 && use_amx && W.paired && M >= AMX8_MIN_ROWS) amx::amx_rows8(a, W, y, g0, g1);
    else if (q16) use_vnni ? vnni::q8_rows<true>(a, W, y, g0, g1) : avx2::q8_rows<true>(a, W, y, g0, g1);
    else if (q8) use_vnni ? vnni::q8_rows<false>(a, W, y, g0, g1) : avx2::q8_rows<false>(a, W, y, g0, g1);
    else exact_rows(x, W, y, M, g0, g1);
  });
}

torch::Tensor gemm_gguf(torch::Tensor x, const QMatrix& W) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.size(1) == W.K, "x: float32 [M, K]");
  x = x.contiguous();
  auto y = torch::empty({x.size(0), W.N}, x.options());
  matmul(x.data_ptr<float>(), W, y.data_ptr<float>(), x.size(0));
  return y;
}

// qkv_bias: Qwen2's biases on q, k and v, fp32 [qkv.N], added to each row's product (one add a value: rows stay
// independent). variant: a Gemma 3 block's additions (common.h).
void block_gguf(torch::Tensor x, torch::Tensor slot, torch::Tensor pos, torch::Tensor norm1, const QMatrix& qkv,
                const QMatrix& o, torch::Tensor norm2, const QMatrix& gate_up, const QMatrix& down,
                torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos, torch::Tensor sin, int64_t hq,
                int64_t hk, double eps, c10::optional<torch::Tensor> qkv_bias, const specdec::BlockVariant& variant) {
  const QMatrix* w[4] = {&qkv, &o, &gate_up, &down};
  const int64_t H = x.size(1);
  TORCH_CHECK(qkv.K == H && gate_up.K == H && o.N == H && down.N == H && gate_up.N == 2 * down.K,
              "weight shapes do not match the hidden size");
  const float* bias = nullptr;
  if (qkv_bias.has_value()) {
    TORCH_CHECK(qkv_bias->dtype() == torch::kFloat32 && qkv_bias->is_contiguous() && qkv_bias->numel() == qkv.N,
                "qkv_bias: contiguous float32 [q + k + v outputs]");
    bias = qkv_bias->data_ptr<float>();
  }
  specdec::decoder_block(x, slot, pos, norm1, norm2, down.K, k_cache, v_cache, cos, sin, hq, hk, eps,
                         [&](int which, const float* in, float* out, int64_t M) {
                           matmul(in, *w[which], out, M);
                           if (which == specdec::QKV && bias != nullptr)
                             for (int64_t r = 0; r < M; ++r)
                               for (int64_t j = 0; j < qkv.N; ++j) out[r * qkv.N + j] += bias[j];
                         }, variant);
}

void decode_block_gguf(torch::Tensor x, torch::Tensor slot, torch::Tensor pos, torch::Tensor norm1,
                       const QMatrix& qkv, const QMatrix& o, torch::Tensor norm2, const QMatrix& gate_up,
                       const QMatrix& down, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                       torch::Tensor sin, int64_t hq, int64_t hk, double eps,
                       c10::optional<torch::Tensor> qkv_bias) {
  block_gguf(x, slot, pos, norm1, qkv, o, norm2, gate_up, down, k_cache, v_cache, cos, sin, hq, hk, eps, qkv_bias, {});
}

// A mixture-of-experts layer (Qwen3-MoE, Mixtral) on GGUF blocks, in place of a block's MLP. Each row's router
// logits (fp32 products with the F32 router [E, H]) go through a softmax; its k most probable experts (ties: the lower
// index) weigh their outputs by those probabilities, renormalized to sum to 1 when `norm`, as llama.cpp routes them.
// Each expert is computed once a pass over the rows routed to it (gathered): its [gate; up] and down matrices are
// read once however many rows use it. A row's sum adds its experts
// in ascending order, and the products are batch-invariant, so a row's output does not depend on the other rows. `touched` counts the experts
// the passes read, `calls` the passes (Python reads them: the experts a verify pass of n rows touches).
struct MoeLayer {
  torch::Tensor router;  // [E, H] float32
  std::vector<const QMatrix*> gate_up, down;  // per expert: [2F, H] and [H, F]
  int64_t k;
  bool norm;
  pybind11::list keep;
  int64_t touched = 0, calls = 0;
  MoeLayer(torch::Tensor router_, const pybind11::list& gate_up_, const pybind11::list& down_, int64_t k_, bool norm_)
      : router(router_.contiguous()), k(k_), norm(norm_), keep(pybind11::make_tuple(gate_up_, down_)) {
    TORCH_CHECK(router.dtype() == torch::kFloat32 && router.dim() == 2, "router: float32 [experts, hidden]");
    const int64_t E = router.size(0), H = router.size(1);
    TORCH_CHECK(int64_t(gate_up_.size()) == E && int64_t(down_.size()) == E, "one [gate; up] and one down a expert");
    TORCH_CHECK(k >= 1 && k <= E, "experts a token: 1 to the number of experts");
    for (int64_t e = 0; e < E; ++e) {
      gate_up.push_back(&gate_up_[e].cast<const QMatrix&>());
      down.push_back(&down_[e].cast<const QMatrix&>());
      TORCH_CHECK(gate_up[e]->K == H && down[e]->N == H && gate_up[e]->N == 2 * down[e]->K,
                  "an expert's matrices do not match the hidden size");
    }
  }
  void operator()(const float* h, float* out, int64_t R) {
    const int64_t E = router.size(0), H = router.size(1), F = down[0]->K;
    const float* W = router.data_ptr<float>();
    std::vector<float> p(R * E);  // router logits, then probabilities
    at::parallel_for(0, R * E, 8, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {  // each logit by the same code whatever the split: rows stay independent
        const float* x = h + (i / E) * H;
        const float* w = W + (i % E) * H;
        __m256 acc = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= H; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(w + j), acc);
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, acc);
        float s = 0.f;
        for (int t = 0; t < 8; ++t) s += lanes[t];
        for (; j < H; ++j) s += x[j] * w[j];
        p[i] = s;
      }
    });
    std::vector<std::vector<std::pair<int64_t, float>>> routed(E);  // expert -> (row, weight)
    std::vector<int64_t> order(E);
    for (int64_t r = 0; r < R; ++r) {
      float* pr = p.data() + r * E;
      const float mx = *std::max_element(pr, pr + E);
      float sum = 0.f;
      for (int64_t e = 0; e < E; ++e) sum += (pr[e] = std::exp(pr[e] - mx));
      for (int64_t e = 0; e < E; ++e) pr[e] /= sum;
      for (int64_t e = 0; e < E; ++e) order[e] = e;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t b) { return pr[a] > pr[b] || (pr[a] == pr[b] && a < b); });
      float chosen = 0.f;
      for (int64_t j = 0; j < k; ++j) chosen += pr[order[j]];
      for (int64_t j = 0; j < k; ++j) routed[order[j]].push_back({r, norm ? pr[order[j]] / chosen : pr[order[j]]});
    }
    // The experts the rows use, each a thread's whole (its products on one thread: one team a pass instead of two
    // barriers an expert, and whoever runs it computes the same values); their rows' outputs side by side in y.
    std::vector<int64_t> used, off{0};
    for (int64_t e = 0; e < E; ++e)
      if (!routed[e].empty()) {
        used.push_back(e);
        off.push_back(off.back() + int64_t(routed[e].size()));
      }
    const int64_t total = off.back();
    std::vector<float> xin(total * H), g(total * 2 * F), act(total * F), y(total * H);
    ++calls;
    touched += int64_t(used.size());
    const auto experts = [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const auto& rows = routed[used[u]];
        const int64_t n = int64_t(rows.size()), o0 = off[u];
        for (int64_t i = 0; i < n; ++i) std::copy_n(h + rows[i].first * H, H, xin.data() + (o0 + i) * H);
        matmul(xin.data() + o0 * H, *gate_up[used[u]], g.data() + o0 * 2 * F, n);
        for (int64_t i = o0; i < o0 + n; ++i)
          for (int64_t j = 0; j < F; ++j) {  // silu(gate) * up
            const float gate = g[i * 2 * F + j];
            act[i * F + j] = gate / (1.f + std::exp(-gate)) * g[i * 2 * F + F + j];
          }
        matmul(act.data() + o0 * F, *down[used[u]], y.data() + o0 * H, n);
      }
    };
    // Many experts (Qwen3-MoE's 8 a token): a thread each, no barrier between them. A few large ones (Mixtral's 2):
    // one after another, each product split over the team, which a thread an expert would leave idle.
    if (int64_t(used.size()) >= 4 * at::get_num_threads()) at::parallel_for(0, int64_t(used.size()), 1, experts);
    else experts(0, int64_t(used.size()));
    std::fill(out, out + R * H, 0.f);
    for (size_t u = 0; u < used.size(); ++u) {  // a row adds its experts in ascending order
      const auto& rows = routed[used[u]];
      for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
        float* o = out + rows[i].first * H;
        const float* yi = y.data() + (off[u] + i) * H;
        const float wgt = rows[i].second;
        for (int64_t j = 0; j < H; ++j) o[j] += wgt * yi[j];
      }
    }
  }
};

// The decoder blocks of a model on GGUF blocks, held once so that a pass crosses from Python to C++ once: looping
// over the blocks in Python, a pass paid 30 calls of 15 arguments each (one call instead: a one-row pass 0.98x the
// time, alternated in one process). Each entry is a block's (norm1, qkv, o, norm2, gate_up, down), as
// decode_block_gguf takes them, then optionally Qwen2's qkv_bias (or None) and a block's variant (None: a Llama
// block): (q_norm, k_norm, post_attention_norm, post_feedforward_norm, scale, window, cos, sin, gelu, softcap), any of
// the tensors None where the block has none (Qwen3: the q and k norms only; Gemma 2: the post-norms and softcap;
// Gemma 3: all but softcap), scale 0 for head_dim^-1/2, cos and sin this layer's own RoPE tables (Gemma's sliding
// and global layers have different bases); then optionally a MoeLayer, whose experts replace the MLP (the entry's
// gate_up and down are then its expert 0's, which give the block its sizes). The Python objects are kept alive with
// it.
struct GgufStack {
  std::vector<torch::Tensor> norm1, norm2;
  std::vector<c10::optional<torch::Tensor>> bias;
  std::vector<const QMatrix*> qkv, o, gate_up, down;
  std::vector<specdec::BlockVariant> variant;
  std::vector<c10::optional<torch::Tensor>> cos, sin;  // a layer's own tables, where it has them
  pybind11::list keep;
  explicit GgufStack(const pybind11::list& blocks) : keep(blocks) {
    for (const auto& item : blocks) {
      const auto t = item.cast<pybind11::tuple>();
      TORCH_CHECK(t.size() >= 6 && t.size() <= 9,
                  "a block is (norm1, qkv, o, norm2, gate_up, down[, qkv_bias[, variant[, experts]]])");
      norm1.push_back(t[0].cast<torch::Tensor>());
      qkv.push_back(&t[1].cast<const QMatrix&>());
      o.push_back(&t[2].cast<const QMatrix&>());
      norm2.push_back(t[3].cast<torch::Tensor>());
      gate_up.push_back(&t[4].cast<const QMatrix&>());
      down.push_back(&t[5].cast<const QMatrix&>());
      bias.push_back(t.size() >= 7 && !t[6].is_none() ? c10::optional<torch::Tensor>(t[6].cast<torch::Tensor>())
                                                       : c10::nullopt);
      variant.emplace_back();
      cos.emplace_back();
      sin.emplace_back();
      if (t.size() >= 8 && !t[7].is_none()) read_variant(t[7].cast<pybind11::tuple>(), t[0].cast<torch::Tensor>().numel());
      if (t.size() == 9 && !t[8].is_none()) {  // a MoeLayer in place of the MLP (gate_up and down: its expert 0's)
        MoeLayer* layer = &t[8].cast<MoeLayer&>();
        TORCH_CHECK(layer->router.size(1) == t[0].cast<torch::Tensor>().numel(), "the router's width is not hidden's");
        variant.back().moe = [layer](const float* h, float* out, int64_t R) { (*layer)(h, out, R); };
      }
    }
  }
  void read_variant(const pybind11::tuple& g, int64_t H) {
    TORCH_CHECK(g.size() == 10, "a block's variant is (q_norm, k_norm, post_attention_norm, post_feedforward_norm, "
                                "scale, window, cos, sin, gelu, softcap)");
    // a norm's weights, or nullptr for None; n: its length (the head size when 0, taken from the tables)
    const auto vec = [&](int i, int64_t n) -> const float* {
      if (g[i].is_none()) return nullptr;
      const auto t = g[i].cast<torch::Tensor>();
      TORCH_CHECK(t.is_contiguous() && t.dtype() == torch::kFloat32 && (n == 0 || t.numel() == n),
                  "a norm: contiguous float32 [", n, "]");
      return t.data_ptr<float>();
    };
    specdec::BlockVariant& v = variant.back();
    v.q_norm = vec(0, 0);
    v.k_norm = vec(1, 0);
    TORCH_CHECK((v.q_norm == nullptr) == (v.k_norm == nullptr) &&
                    (v.q_norm == nullptr || g[0].cast<torch::Tensor>().numel() == g[1].cast<torch::Tensor>().numel()),
                "q_norm and k_norm: both None, or both [head_dim]");
    v.post_attn_norm = vec(2, H);
    v.post_ff_norm = vec(3, H);
    v.scale = g[4].cast<float>();
    v.window = g[5].cast<int64_t>();
    v.gelu = g[8].cast<bool>();
    v.softcap = g[9].cast<float>();
    TORCH_CHECK(v.scale >= 0.f && v.window >= 0 && v.softcap >= 0.f,
                "scale >= 0 (0: head_dim^-1/2), window >= 0 (0: no window), softcap >= 0 (0: none)");
    TORCH_CHECK(g[6].is_none() == g[7].is_none(), "a layer's RoPE tables: cos and sin, or neither");
    if (!g[6].is_none()) {
      cos.back() = g[6].cast<torch::Tensor>();
      sin.back() = g[7].cast<torch::Tensor>();
      TORCH_CHECK(cos.back()->is_contiguous() && sin.back()->is_contiguous() &&
                      (v.q_norm == nullptr || cos.back()->size(1) == g[0].cast<torch::Tensor>().numel()),
                  "a layer's RoPE tables: contiguous [positions, head_dim]");
    }
  }
  int64_t layers() const { return int64_t(qkv.size()); }
};

// Every block of `stack` in turn on x [R, H] in place: what calling decode_block_gguf block by block computes, bit
// for bit. k_caches and v_caches: one tensor a block. `taps` (layer indices, the number of layers for the last
// block's output) copy the residual stream entering those blocks into feats [>= row0 + R, taps * H] at rows
// [row0, row0 + R), as transformer.py's loop does for a draft head. The GIL is released while the blocks run, so a
// server's other threads go on meanwhile.
void decode_stack_gguf(const GgufStack& stack, torch::Tensor x, torch::Tensor slot, torch::Tensor pos,
                       const std::vector<torch::Tensor>& k_caches, const std::vector<torch::Tensor>& v_caches,
                       torch::Tensor cos, torch::Tensor sin, int64_t hq, int64_t hk, double eps,
                       const std::vector<int64_t>& taps, c10::optional<torch::Tensor> feats, int64_t row0) {
  const int64_t L = stack.layers(), R = x.size(0), H = x.size(1);
  TORCH_CHECK(int64_t(k_caches.size()) == L && int64_t(v_caches.size()) == L, "one key and one value cache a block");
  TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32 && x.dim() == 2, "x: contiguous float32 [R, H]");
  for (int64_t t : taps) TORCH_CHECK(t >= 0 && t <= L, "a tap is a layer index, 0 to ", L);
  TORCH_CHECK(taps.empty() || (feats.has_value() && feats->is_contiguous() && feats->dtype() == torch::kFloat32 &&
                               feats->dim() == 2 && feats->size(0) >= row0 + R && row0 >= 0 &&
                               feats->size(1) == int64_t(taps.size()) * H),
              "feats: contiguous float32 [rows, taps * hidden] holding rows row0 to row0 + R");
  float* fp = taps.empty() ? nullptr : feats->data_ptr<float>();
  const auto tap = [&](int64_t layer) {
    for (size_t j = 0; j < taps.size(); ++j)
      if (taps[j] == layer)
        for (int64_t r = 0; r < R; ++r)
          std::copy_n(x.data_ptr<float>() + r * H, H, fp + (row0 + r) * int64_t(taps.size()) * H + int64_t(j) * H);
  };
  pybind11::gil_scoped_release free;
  for (int64_t i = 0; i < L; ++i) {
    tap(i);
    block_gguf(x, slot, pos, stack.norm1[i], *stack.qkv[i], *stack.o[i], stack.norm2[i], *stack.gate_up[i],
               *stack.down[i], k_caches[i], v_caches[i], stack.cos[i].value_or(cos), stack.sin[i].value_or(sin), hq, hk,
               eps, stack.bias[i], stack.variant[i]);
  }
  tap(L);
}

// One step of an EAGLE-3 draft head (heads/eagle.py) on GGUF blocks, in place: g [R, H], the hidden input and
// the residual, becomes the layer's output. Its [q; k; v] product reads [input_norm(e) ; hidden_norm(g)] (K = 2H),
// e [R, H] the rows' token embeddings; the rest is a decoder block's (norm_before_residual false).
void eagle_block_gguf(torch::Tensor g, torch::Tensor e, torch::Tensor e_norm, torch::Tensor slot, torch::Tensor pos,
                      torch::Tensor g_norm, const QMatrix& qkv, const QMatrix& o, torch::Tensor norm2,
                      const QMatrix& gate_up, const QMatrix& down, torch::Tensor k_cache, torch::Tensor v_cache,
                      torch::Tensor cos, torch::Tensor sin, int64_t hq, int64_t hk, double eps) {
  const QMatrix* w[4] = {&qkv, &o, &gate_up, &down};
  const int64_t R = g.size(0), H = g.size(1);
  TORCH_CHECK(e.is_contiguous() && e.dtype() == torch::kFloat32 && e.size(0) == R && e.size(1) == H,
              "e: contiguous float32 [R, H]");
  TORCH_CHECK(qkv.K == 2 * H && gate_up.K == H && o.N == H && down.N == H && gate_up.N == 2 * down.K,
              "weight shapes do not match the hidden size");
  std::vector<float> both(R * 2 * H);  // [R, 2H]: input_norm(e) beside hidden_norm(g)
  for (int64_t r = 0; r < R; ++r)
    specdec::rms_norm_rows(e.data_ptr<float>() + r * H, e_norm.data_ptr<float>(), both.data() + r * 2 * H, 1, H,
                           float(eps));
  specdec::decoder_block(g, slot, pos, g_norm, norm2, down.K, k_cache, v_cache, cos, sin, hq, hk, eps,
                         [&](int which, const float* in, float* out, int64_t M) {
                           if (which != specdec::QKV) return matmul(in, *w[which], out, M);
                           for (int64_t r = 0; r < M; ++r) std::copy(in + r * H, in + (r + 1) * H,
                                                                     both.data() + r * 2 * H + H);
                           matmul(both.data(), qkv, out, M);
                         });
}

// The int8 multiply-add peak of this machine's vector units: the widest dot product the kernels run here (gguf_q8.inc
// dot_peak: 512-bit vpdpbusd on the VNNI and AMX builds, the AVX2 build's own), every thread at once for `seconds`.
// Multiply-adds per second. AMX's tiles, where a prefill's products run on such a CPU, peak far higher: the floors
// count the vector units (bench/hardware/profile.py says why).
double int8_peak(double seconds) {
  return specdec::over_threads(seconds, use_vnni ? vnni::dot_peak : avx2::dot_peak);
}

// Which build of the q8 kernel runs: "amx" (the VNNI build, with AMX's tiles for passes of several rows), "vnni"
// (where the CPU has AVX512-VNNI), "avx2", or "auto" (the best the CPU has); attention's tiles follow (AVX-512 with
// "amx" and "vnni", AVX2 with "avx2"). Returns the build that ran before, so a caller can put it back.
std::string isa() { return use_amx ? "amx" : use_vnni ? "vnni" : "avx2"; }

std::string set_isa(const std::string& want) {
  const std::string before = isa();
  TORCH_CHECK(want == "auto" || want == "avx2" || want == "vnni" || want == "amx",
              "isa must be auto, avx2, vnni or amx, not ", want);
  TORCH_CHECK(want != "vnni" || cpu_has_vnni(), "this CPU has no AVX512-VNNI");
  TORCH_CHECK(want != "amx" || cpu_has_amx(), "this CPU has no AMX-INT8 that this process may use");
  use_amx = specdec::amx_tiles = want == "amx" || (want == "auto" && cpu_has_amx());
  use_vnni = use_amx || want == "vnni" || (want == "auto" && cpu_has_vnni());
  specdec::wide = want != "avx2" && (want != "auto" || specdec::cpu_has_avx512());
  return before;
}

}  // namespace

void specdec::register_gguf(pybind11::module& m) {
  pybind11::class_<QMatrix>(m, "QMatrix")
      .def(pybind11::init<int64_t, int64_t, int64_t, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>,
                          bool, int64_t, bool, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, int64_t>(),
           "QMatrix(bits, N, K, q, d, m, rows, act_bits, paired, hb, sc, scales): a [N, K] matrix of 32-weight "
           "blocks in planes (see gguf.cpp and gguf_kq.inc)",
           pybind11::arg("bits"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("q"), pybind11::arg("d"),
           pybind11::arg("m"), pybind11::arg("rows"), pybind11::arg("act_bits") = 8, pybind11::arg("paired") = false,
           pybind11::arg("hb") = pybind11::none(), pybind11::arg("sc") = pybind11::none(),
           pybind11::arg("scales") = 0)
      .def(pybind11::init<const pybind11::list&>(), "QMatrix([parts]): matrices of one K stacked by rows, each part "
           "on its own format's kernel", pybind11::arg("parts"))
      .def_readonly("bits", &QMatrix::bits)
      .def_readonly("N", &QMatrix::N)
      .def_readonly("K", &QMatrix::K)
      .def_readonly("act_bits", &QMatrix::act_bits)
      .def_readonly("paired", &QMatrix::paired)
      .def_readonly("scales", &QMatrix::scales)
      .def_property_readonly("stacked", [](const QMatrix& w) { return int64_t(w.parts.size()); })
      .def_property_readonly("nbytes", &QMatrix::nbytes);
  m.def("kq_pack", &kq_pack, "kq_pack(kind, parts, N, K, paired, zeroed=[]) -> [q, d, m, hb, sc]: gguf_kq.inc's "
        "planes of a matrix's blocks as stored, its parts stacked by rows (see gguf_pack.inc)",
        pybind11::arg("kind"), pybind11::arg("parts"), pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("paired"),
        pybind11::arg("zeroed") = std::vector<c10::optional<torch::Tensor>>());
  m.def("gemm_gguf", &gemm_gguf, "y [M, N] = x [M, K] . W^T on GGUF blocks (row layout: exact; interleaved: q8)");
  m.def("decode_block_gguf", &decode_block_gguf, "one decoder block on GGUF blocks, in place",
        pybind11::arg("x"), pybind11::arg("slot"), pybind11::arg("pos"), pybind11::arg("norm1"), pybind11::arg("qkv"),
        pybind11::arg("o"), pybind11::arg("norm2"), pybind11::arg("gate_up"), pybind11::arg("down"),
        pybind11::arg("k_cache"), pybind11::arg("v_cache"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("hq"), pybind11::arg("hk"), pybind11::arg("eps"), pybind11::arg("qkv_bias") = pybind11::none());
  pybind11::class_<MoeLayer>(m, "MoeLayer")
      .def(pybind11::init<torch::Tensor, const pybind11::list&, const pybind11::list&, int64_t, bool>(),
           "MoeLayer(router [E, H] float32, [gate; up] per expert, down per expert, k, norm): a block's experts",
           pybind11::arg("router"), pybind11::arg("gate_up"), pybind11::arg("down"), pybind11::arg("k"),
           pybind11::arg("norm"))
      .def_readwrite("touched", &MoeLayer::touched)
      .def_readwrite("calls", &MoeLayer::calls);
  pybind11::class_<GgufStack>(m, "GgufStack")
      .def(pybind11::init<const pybind11::list&>(), "GgufStack(blocks): each block's (norm1, qkv, o, norm2, gate_up, "
           "down), held for decode_stack_gguf")
      .def_property_readonly("layers", &GgufStack::layers);
  m.def("decode_stack_gguf", &decode_stack_gguf, "every block of a GgufStack in turn, in place (one call a pass)",
        pybind11::arg("stack"), pybind11::arg("x"), pybind11::arg("slot"), pybind11::arg("pos"),
        pybind11::arg("k_caches"), pybind11::arg("v_caches"), pybind11::arg("cos"), pybind11::arg("sin"),
        pybind11::arg("hq"), pybind11::arg("hk"), pybind11::arg("eps"), pybind11::arg("taps") = std::vector<int64_t>(),
        pybind11::arg("feats") = pybind11::none(), pybind11::arg("row0") = 0);
  m.def("eagle_block_gguf", &eagle_block_gguf, "an EAGLE-3 draft head's layer on GGUF blocks, in place");
  m.def("int8_peak", &int8_peak,
        "int8 multiply-adds per second over all threads, at the widest dot product the kernels run");
  m.def("kv_types", &specdec::kv_type_names, "the KV cache types attention runs on this CPU (f16, q8_0, q4_0)");
  m.def("isa", &isa, "the q8 kernel's build in use: avx2, vnni or amx");
  m.def("set_isa", &set_isa,
        "the kernels' build: auto, avx2, vnni or amx (AVX-512 attention too); returns the one before");
  m.def("cpu_has_vnni", &cpu_has_vnni, "whether this CPU has AVX512-VNNI (and the AVX-512 it needs)");
  m.def("cpu_has_amx", &cpu_has_amx, "whether this CPU has AMX-INT8 and this process may use it");
}
