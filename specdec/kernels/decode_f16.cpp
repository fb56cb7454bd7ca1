// y[M, N] = x[M, K] (fp32) . w[N, K]^T (fp16 weights) + bias, for the few rows of a decode or verify pass.
//
// Memory-bound by design: for up to 12 rows every weight is read once per call and used for all rows while
// it is in registers. Batch-invariant by construction: the result
// for (m, n) is one 8-lane FMA chain over K in ascending order followed by a fixed horizontal sum, so it
// does not depend on M, on the other rows, or on which tile n falls in.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "common.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using specdec::hsum;
using specdec::load_w;
using specdec::exp256;

// One tile: weight rows n and n+1 against activation rows [m0, m0 + MB). Each (m, n) accumulates in its own
// register in ascending k; the tile shape only decides which chains run side by side.
template <int MB>
inline void tile2(const float* x, const at::Half* w0, const at::Half* w1, const float* bias, float* y,
                  int64_t N, int64_t K, int64_t m0, int64_t n, bool prefetch) {
  __m256 a0[MB], a1[MB];
  for (int i = 0; i < MB; ++i) { a0[i] = _mm256_setzero_ps(); a1[i] = _mm256_setzero_ps(); }
  for (int64_t k = 0; k < K; k += 8) {
    if (prefetch && (k & 31) == 0) {  // pull the next tile's weights in while this one computes
      _mm_prefetch(reinterpret_cast<const char*>(w1 + K + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + 2 * K + k), _MM_HINT_T0);
    }
    const __m256 v0 = load_w(w0 + k), v1 = load_w(w1 + k);
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + (m0 + i) * K + k);
      a0[i] = _mm256_fmadd_ps(xv, v0, a0[i]);
      a1[i] = _mm256_fmadd_ps(xv, v1, a1[i]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    y[(m0 + i) * N + n] = hsum(a0[i]) + (bias ? bias[n] : 0.f);
    y[(m0 + i) * N + n + 1] = hsum(a1[i]) + (bias ? bias[n + 1] : 0.f);
  }
}

template <int MB>
inline void tile1(const float* x, const at::Half* w0, const float* bias, float* y, int64_t N, int64_t K,
                  int64_t m0, int64_t n) {
  __m256 a0[MB];
  for (int i = 0; i < MB; ++i) a0[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 v0 = load_w(w0 + k);
    for (int i = 0; i < MB; ++i) a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + (m0 + i) * K + k), v0, a0[i]);
  }
  for (int i = 0; i < MB; ++i) y[(m0 + i) * N + n] = hsum(a0[i]) + (bias ? bias[n] : 0.f);
}

template <int MB>
void pass2(const float* x, const at::Half* w, const float* bias, float* y, int64_t N, int64_t K, int64_t m0,
           int64_t n0, int64_t n1, bool prefetch) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) tile2<MB>(x, w + n * K, w + (n + 1) * K, bias, y, N, K, m0, n, prefetch);
  if (n < n1) tile1<MB>(x, w + n * K, bias, y, N, K, m0, n);
}

template <int MB>
void pass1(const float* x, const at::Half* w, const float* bias, float* y, int64_t N, int64_t K, int64_t m0,
           int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < K; k += 32) _mm_prefetch(reinterpret_cast<const char*>(w + (n + 1) * K + k), _MM_HINT_T0);
    tile1<MB>(x, w + n * K, bias, y, N, K, m0, n);
  }
}

// Prefill-sized calls: compute-bound, so the weights of a slab are converted to fp32 once (in L2) and used in
// tiles of MB rows x NB weight rows, which load 7 vectors per 12 FMAs where a one-weight-row tile loads 13.
template <int MB, int NB>
inline void tile_f32(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t K,
                     int64_t m0, int64_t n) {
  __m256 a[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) a[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + (m0 + i) * K + k);
      for (int j = 0; j < NB; ++j) a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[(m0 + i) * N + n + j] = hsum(a[i][j]) + (bias ? bias[n + j] : 0.f);
}

template <int MB>
void slab_rows(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t K, int64_t m0,
               int64_t s0, int64_t s1) {
  int64_t n = s0;
  for (; n + 3 <= s1; n += 3) tile_f32<MB, 3>(x, w + (n - s0) * K, bias, y, N, K, m0, n);
  for (; n < s1; ++n) tile_f32<MB, 1>(x, w + (n - s0) * K, bias, y, N, K, m0, n);
}

}  // namespace

// Weight rows [s0, s1) held in fp32 at w ([s1 - s0, K]) against all M rows of x: the same per-(m, n) FMA chain as
// the few-row tiles above, so a result does not depend on which path computed it.
void specdec::f32_slab(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N,
                       int64_t K, int64_t s0, int64_t s1) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) slab_rows<4>(x, w, bias, y, N, K, m0, s0, s1);
  for (; m0 < M; ++m0) slab_rows<1>(x, w, bias, y, N, K, m0, s0, s1);
}

namespace {

void many_rows(const float* x, const at::Half* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
               int64_t n0, int64_t n1) {
  const int64_t slab = std::max<int64_t>(3, (int64_t(1) << 16) / K);  // 256 KB of fp32 weights
  std::vector<float> buf(slab * K);
  for (int64_t s0 = n0; s0 < n1; s0 += slab) {
    const int64_t s1 = std::min(n1, s0 + slab);
    for (int64_t i = 0; i < (s1 - s0) * K; i += 8) _mm256_storeu_ps(buf.data() + i, load_w(w + s0 * K + i));
    specdec::f32_slab(x, buf.data(), bias, y, M, N, K, s0, s1);
  }
}

// Up to 6 rows: tiles of 2 weight rows x all rows (12 accumulators). 7 to 12 rows: tiles of 1 weight row x
// all rows, so the weights still pass once. More rows (prefill-sized): many_rows.
void rows(const float* x, const at::Half* w, const float* bias, float* y,
          int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  if (M <= 6) {
    switch (M) {
      case 1: pass2<1>(x, w, bias, y, N, K, 0, n0, n1, true); break;
      case 2: pass2<2>(x, w, bias, y, N, K, 0, n0, n1, true); break;
      case 3: pass2<3>(x, w, bias, y, N, K, 0, n0, n1, true); break;
      case 4: pass2<4>(x, w, bias, y, N, K, 0, n0, n1, true); break;
      case 5: pass2<5>(x, w, bias, y, N, K, 0, n0, n1, true); break;
      default: pass2<6>(x, w, bias, y, N, K, 0, n0, n1, true); break;
    }
    return;
  }
  if (M > 12) {
    many_rows(x, w, bias, y, M, N, K, n0, n1);
    return;
  }
  const int64_t slab = std::max<int64_t>(2, (int64_t(1) << 17) / (K * 2));
  for (int64_t s0 = n0; s0 < n1; s0 += slab) {
    const int64_t s1 = std::min(n1, s0 + slab);
    switch (M) {
      case 7: pass1<7>(x, w, bias, y, N, K, 0, s0, s1); break;
      case 8: pass1<8>(x, w, bias, y, N, K, 0, s0, s1); break;
      case 9: pass1<9>(x, w, bias, y, N, K, 0, s0, s1); break;
      case 10: pass1<10>(x, w, bias, y, N, K, 0, s0, s1); break;
      case 11: pass1<11>(x, w, bias, y, N, K, 0, s0, s1); break;
      default: pass1<12>(x, w, bias, y, N, K, 0, s0, s1); break;
    }
  }
}

}  // namespace

void gemv_raw(const float* xp, const at::Half* wp, const float* b, float* yp, int64_t M, int64_t N, int64_t K) {
  // Split the weight rows between threads in pairs (the split does not change any result).
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, 32, [&](int64_t p0, int64_t p1) {
    rows(xp, wp, b, yp, M, N, K, p0 * 2, std::min(N, p1 * 2));
  });
}

torch::Tensor gemv_f16(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && w.dtype() == torch::kHalf, "x float32, w float16");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K], w [N, K]");
  TORCH_CHECK(w.size(1) % 8 == 0, "K must be a multiple of 8");
  x = x.contiguous();
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  auto y = torch::empty({M, N}, x.options());
  const float* b = nullptr;
  torch::Tensor bc;
  if (bias.has_value()) { bc = bias->contiguous(); b = bc.data_ptr<float>(); }
  const float* xp = x.data_ptr<float>();
  const at::Half* wp = w.data_ptr<at::Half>();
  float* yp = y.data_ptr<float>();
  gemv_raw(xp, wp, b, yp, M, N, K);
  return y;
}


// ---- One decoder block for a decode or verify pass, in place on the residual stream -------------------
// Every step is per row (or per query) with a fixed order of operations, so a row's result does not depend
// on the other rows: the pass over k+1 tokens gives bit for bit what k+1 one-token passes give.

namespace {

// One row of H values (a multiple of 8); out may be x.
inline void norm_row(const float* x, const float* w, float* out, int64_t H, float eps) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < H; i += 8) { __m256 v = _mm256_loadu_ps(x + i); acc = _mm256_fmadd_ps(v, v, acc); }
  const float inv = 1.0f / std::sqrt(hsum(acc) / float(H) + eps);
  for (int64_t i = 0; i < H; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

void specdec::rms_norm_rows(const float* x, const float* w, float* out, int64_t R, int64_t H, float eps) {
  over_rows(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(x + r * H, w, out + r * H, H, eps);
  });
}

namespace {

inline void rope(float* v, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float a = v[j], b = v[j + half];
    v[j] = a * cos[j] - b * sin[j];
    v[j + half] = b * cos[j + half] + a * sin[j + half];
  }
}

}  // namespace

// A ragged pass: token-row r belongs to cache slot slot[r] and sits at position pos[r].
// x [R, H] (updated in place); slot, pos [R] int64; fp16 caches as attention.cpp lays them out; cos/sin
// [max_pos, d]. A slot's rows are contiguous. The four matrix products go through `lin`, whatever the weights.
void specdec::decoder_block(torch::Tensor x, torch::Tensor slot, torch::Tensor pos, torch::Tensor norm1,
                            torch::Tensor norm2, int64_t inter, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor cos, torch::Tensor sin, int64_t hq, int64_t hk, double eps,
                            const LinearFn& lin, const BlockVariant& variant) {
  TORCH_CHECK(x.is_contiguous() && x.dtype() == torch::kFloat32, "x: contiguous float32");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const int64_t d = cos.size(1);  // the head dim
  // fp16: keys [slots, hk, cap/KB, d, KB], values [slots, hk, cap, d]; a quantized type: bytes [slots, hk, cap/KB,
  // its block's bytes] each (attention_q.inc), told apart by that size
  specdec::Kv kind = specdec::Kv::F16;
  if (k_cache.dtype() == torch::kByte) {
    TORCH_CHECK(v_cache.dtype() == torch::kByte && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                    d % 32 == 0 && d <= 256,
                "quantized caches: bytes [slots, hk, cap/KB, block bytes], d a multiple of 32 up to 256");
    kind = k_cache.size(3) == specdec::kv_block_bytes(specdec::Kv::Q8, d) ? specdec::Kv::Q8 : specdec::Kv::Q4;
    TORCH_CHECK(k_cache.size(3) == specdec::kv_block_bytes(kind, d), "a quantized cache block of unknown size");
  } else {
    TORCH_CHECK(k_cache.dtype() == torch::kHalf && v_cache.dtype() == torch::kHalf, "caches must be float16 or bytes");
    TORCH_CHECK(k_cache.dim() == 5 && k_cache.size(4) == specdec::KB && v_cache.dim() == 4 && v_cache.size(3) == d,
                "keys [slots, hk, cap/KB, d, KB], values [slots, hk, cap, d]");
  }
  const int64_t R = pos.numel(), H = x.size(1), slots = k_cache.size(0);
  TORCH_CHECK(slot.numel() == R && x.size(0) == R, "x, slot and pos need one entry per token-row");
  const int64_t cap = k_cache.size(2) * specdec::KB;
  const int64_t qkv_n = (hq + 2 * hk) * d;
  TORCH_CHECK(d % 8 == 0 && H % 8 == 0 && inter % 8 == 0, "sizes must be multiples of 8");
  // The block's intermediates, in one buffer per thread that only grows, so a pass allocates nothing. Each starts on
  // a cache line, as torch's own tensors do: the fp32 tiles' loads of a row must not straddle lines.
  static thread_local std::vector<float> buf;
  const auto lines = [](int64_t n) { return (n + 15) / 16 * 16; };  // floats, rounded up to whole 64-byte lines
  const int64_t sizes[6] = {lines(R * H), lines(R * qkv_n), lines(R * hq * d), lines(R * H), lines(R * 2 * inter),
                            lines(R * inter)};
  int64_t need = 16;
  for (int64_t n : sizes) need += n;
  if (int64_t(buf.size()) < need) buf.resize(need);
  float* next = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) / 4) % 16) % 16;
  float* part[6];
  for (int i = 0; i < 6; ++i) { part[i] = next; next += sizes[i]; }
  float *hp = part[0], *qp = part[1], *ap = part[2], *o = part[3], *gp = part[4], *actp = part[5];
  float* xp = x.data_ptr<float>();
  const torch::Tensor pos_c = pos.contiguous(), slot_c = slot.contiguous();
  const int64_t* pp = pos_c.data_ptr<int64_t>();
  const int64_t* sl = slot_c.data_ptr<int64_t>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  void* kc = k_cache.data_ptr();
  void* vc = v_cache.data_ptr();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(pp[r] >= 0 && pp[r] < cap, "position outside the cache");
    TORCH_CHECK(sl[r] >= 0 && sl[r] < slots, "slot outside the cache");
  }

  rms_norm_rows(xp, norm1.data_ptr<float>(), hp, R, H, float(eps));
  lin(QKV, hp, qp, R);
  const float* q_norm = variant.q_norm;
  const float* k_norm = variant.k_norm;
  // Rotate q and k; write k and v (fp16) at their positions. An item is a key head with all of its rows (rotated,
  // stored), then one row's query head. A key block holds 32 positions of a dim in each cache line, so two threads
  // storing neighbouring rows of one head wrote the same lines: split by row, this step took 0.39 ms of a 6-row
  // gguf-q16 pass at context 512 (1 row: 0.06), timed per phase on an Intel Xeon; by key head 0.18, and whole passes
  // 0.97 to 0.99x the time from 2 to 8 rows (kernel_ab, 60 alternated repetitions).
  over_items(hk + R * hq, hk + 2 * hq, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (i < hk) {
        for (int64_t r = 0; r < R; ++r) {
          float* row = qp + r * qkv_n;
          if (k_norm) norm_row(row + (hq + i) * d, k_norm, row + (hq + i) * d, d, float(eps));
          rope(row + (hq + i) * d, cp + pp[r] * d, sp + pp[r] * d, d);
          if (kind == specdec::Kv::F16)
            specdec::store_kv(row + (hq + i) * d, row + (hq + hk + i) * d, static_cast<at::Half*>(kc),
                              static_cast<at::Half*>(vc), sl[r], i, pp[r], hk, cap, d);
          else
            specdec::store_kv_q(row + (hq + i) * d, row + (hq + hk + i) * d, static_cast<uint8_t*>(kc),
                                static_cast<uint8_t*>(vc), kind, sl[r], i, pp[r], hk, cap, d);
        }
      } else {
        const int64_t r = (i - hk) / hq, h = (i - hk) % hq;
        if (q_norm) norm_row(qp + r * qkv_n + h * d, q_norm, qp + r * qkv_n + h * d, d, float(eps));
        rope(qp + r * qkv_n + h * d, cp + pp[r] * d, sp + pp[r] * d, d);
      }
    }
  });
  const float scale = variant.scale > 0.f ? variant.scale : 1.0f / std::sqrt(float(d));
  specdec::attention(qp, qkv_n, sl, pp, R, kc, vc, kind, hq, hk, cap, d, scale, variant.window, ap,
                     variant.softcap);
  lin(O, ap, o, R);
  if (variant.post_attn_norm) rms_norm_rows(o, variant.post_attn_norm, o, R, H, float(eps));
  const float* op = o;
  const auto add_residual = [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * H; i < r1 * H; ++i) xp[i] += op[i];
  };
  over_rows(R, add_residual);
  rms_norm_rows(xp, norm2.data_ptr<float>(), hp, R, H, float(eps));
  if (variant.moe) {  // the experts each row is routed to, in place of the MLP
    variant.moe(hp, o, R);
  } else {
    lin(GATE_UP, hp, gp, R);
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    // GELU's tanh form is gate * sigmoid(2u), u = sqrt(2 / pi) (gate + 0.044715 gate^3): the sigmoid of SiLU's
    // loop at gate (c1 + c3 gate^2) instead of gate
    const __m256 c1 = _mm256_set1_ps(1.5957691216057308f), c3 = _mm256_set1_ps(0.07135481627260025f);
    const bool gelu = variant.gelu;
    const int64_t vecs = inter / 8;  // an item is 8 of a row's values
    over_items(R * vecs, 2 * vecs, [&](int64_t i0, int64_t i1) {
      for (int64_t v = i0; v < i1; ++v) {  // silu(gate) * up, or gelu(gate) * up
        const int64_t r = v / vecs, i = v % vecs * 8;
        const __m256 gate = _mm256_loadu_ps(gp + r * 2 * inter + i);
        const __m256 up = _mm256_loadu_ps(gp + r * 2 * inter + inter + i);
        const __m256 arg = gelu ? _mm256_mul_ps(gate, _mm256_fmadd_ps(c3, _mm256_mul_ps(gate, gate), c1)) : gate;
        const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, arg))));
        _mm256_storeu_ps(actp + r * inter + i, _mm256_mul_ps(_mm256_mul_ps(gate, sig), up));
      }
    });
    lin(DOWN, actp, o, R);
  }
  if (variant.post_ff_norm) rms_norm_rows(o, variant.post_ff_norm, o, R, H, float(eps));
  over_rows(R, add_residual);
}

// The block on fp16 weights (fused [q; k; v] and [gate; up] matrices).
void decode_block(torch::Tensor x, torch::Tensor slot, torch::Tensor pos, torch::Tensor norm1, torch::Tensor qkv_w,
                  c10::optional<torch::Tensor> qkv_b, torch::Tensor o_w, torch::Tensor norm2,
                  torch::Tensor gate_up_w, torch::Tensor down_w, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor cos, torch::Tensor sin, int64_t hq, int64_t hk, double eps) {
  torch::Tensor qb;
  const float* qbp = nullptr;
  if (qkv_b.has_value()) { qb = qkv_b->contiguous(); qbp = qb.data_ptr<float>(); }
  const torch::Tensor* w[4] = {&qkv_w, &o_w, &gate_up_w, &down_w};
  for (const torch::Tensor* t : w) TORCH_CHECK(t->is_contiguous() && t->dtype() == torch::kHalf, "fp16 weights");
  const int64_t H = x.size(1);
  TORCH_CHECK(qkv_w.size(1) == H && gate_up_w.size(1) == H && o_w.size(0) == H && down_w.size(0) == H,
              "weight shapes do not match the hidden size");
  specdec::decoder_block(x, slot, pos, norm1, norm2, down_w.size(1), k_cache, v_cache, cos, sin, hq, hk, eps,
                         [&](int which, const float* in, float* out, int64_t M) {
                           const torch::Tensor& t = *w[which];
                           gemv_raw(in, t.data_ptr<at::Half>(), which == specdec::QKV ? qbp : nullptr, out, M,
                                    t.size(0), t.size(1));
                         });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  x = x.contiguous();
  auto out = torch::empty_like(x);
  specdec::rms_norm_rows(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1),
                         float(eps));
  return out;
}

// One thread's fp32 multiply-adds per second in 12 independent 16-lane FMA chains (AVX-512).
__attribute__((target("avx512f"))) double fma_rate16(double secs) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(0.001f * i);
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
  const auto start = std::chrono::steady_clock::now();
  int64_t done = 0;
  double el = 0;
  do {  // timed here: common.h's steps_per_second is compiled for the default target and could not inline the step
    for (int s = 0; s < (1 << 20); ++s)
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
    done += 1 << 20;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (el < secs);
  __m512 sum = a[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, a[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);  // keeps the chains
  (void)sink;
  return done * 12.0 * 16.0 / el;
}

// The fp32 multiply-add peak of this machine's vector units: every thread runs 12 independent FMA chains at the widest
// vector the kernels run here (16 lanes with AVX-512, 8 on AVX2 or after set_isa("avx2")) for about `seconds`.
// Returns multiply-adds per second, all threads together. The floors count it (bench/hardware/profile.py): attention's
// tiles over an f16 cache issue 16 lanes where the CPU has them, which an Intel core or a Zen 5 runs at twice the
// 8-lane rate (a Zen 4 splits them in two).
double fma_peak(double seconds) {
  if (specdec::wide) return specdec::over_threads(seconds, fma_rate16);
  return specdec::over_threads(seconds, [](double secs) {
    __m256 a[12];
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(0.001f * i);
    const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
    const double steps = specdec::steps_per_second(secs, 1 << 20, [&] {
      for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
    });
    __m256 sum = a[0];
    for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, a[i]);
    return steps * 12.0 * 8.0 + 0.0 * hsum(sum);  // keep the chains alive
  });
}

// Bytes per second at which every thread of the team reads its share of buf (a contiguous byte tensor, at least
// 64 bytes a thread) front to back, as the kernels stream weights: 32-byte loads, software prefetch 4 KB ahead (the
// kernels' distance, gguf_q8.inc), all threads at once; the fastest of `reps` sweeps. What the weights' reads can
// reach on this machine: a torch reduction over the same bytes read 20 to 30% slower than the products did.
double stream_read(torch::Tensor buf, int64_t reps) {
  TORCH_CHECK(buf.is_contiguous() && buf.element_size() == 1 && reps >= 1, "buf: a contiguous byte tensor");
  const uint8_t* p = buf.data_ptr<uint8_t>();
  const int64_t lines = buf.numel() / 64;
  double best = 0;
  std::atomic<int64_t> sink{0};  // keeps the loads: their xor is used
  for (int64_t rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    specdec::team([&](const specdec::Team& tm) {
      const auto [l0, l1] = tm.share(lines);
      __m256i acc = _mm256_setzero_si256();
      for (int64_t l = l0; l < l1; ++l) {
        const uint8_t* at = p + 64 * l;
        _mm_prefetch(reinterpret_cast<const char*>(at + 4096), _MM_HINT_T0);
        acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
        acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32)));
      }
      sink.fetch_xor(_mm256_extract_epi64(acc, 0), std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 64.0 * lines / s);
  }
  return best;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stream_read", &stream_read, "bytes per second of every thread streaming its share of a byte tensor");
  m.def("fma_peak", &fma_peak,
        "fp32 multiply-adds per second over all threads (12 FMA chains a thread, at the widest vector the kernels run)");
  m.def("gemv_f16", &gemv_f16, "fp16-weight GEMV for a few rows");
  m.def("decode_block", &decode_block, "one decoder block for a decode/verify pass, in place");
  m.def("rms_norm", &rms_norm, "RMSNorm over rows");
  specdec::register_gguf(m);
}
