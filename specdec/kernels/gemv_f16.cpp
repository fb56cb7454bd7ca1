// y[M, N] = x[M, K] (fp32) . w[N, K]^T (fp16 weights) + bias, for the few rows of a decode or verify pass.
//
// Memory-bound by design: every weight is read from DRAM once per call whatever M is (a slab of weight rows
// stays in L2 while blocks of up to 6 activation rows pass over it). Batch-invariant by construction: the result
// for (m, n) is one 8-lane FMA chain over K in ascending order followed by a fixed horizontal sum, so it
// does not depend on M, on the other rows, or on which tile n falls in.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

namespace {

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

constexpr int64_t MBLOCK = 6;  // activation rows per pass over a tile (12 accumulators + 3 operands fit AVX2)

template <int MB>
void pass(const float* x, const at::Half* w, const float* bias, float* y, int64_t N, int64_t K, int64_t m0,
          int64_t n0, int64_t n1, bool prefetch) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) tile2<MB>(x, w + n * K, w + (n + 1) * K, bias, y, N, K, m0, n, prefetch);
  if (n < n1) tile1<MB>(x, w + n * K, bias, y, N, K, m0, n);
}

void rows(const float* x, const at::Half* w, const float* bias, float* y,
          int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  // Weight rows in slabs that stay in L2 while every block of activation rows passes over them.
  const int64_t slab = std::max<int64_t>(2, (int64_t(1) << 17) / (K * 2)) & ~int64_t(1);
  for (int64_t s0 = n0; s0 < n1; s0 += slab) {
    const int64_t s1 = std::min(n1, s0 + slab);
    for (int64_t m0 = 0; m0 < M; m0 += MBLOCK) {
      const bool first = m0 == 0;
      switch (std::min(MBLOCK, M - m0)) {
        case 1: pass<1>(x, w, bias, y, N, K, m0, s0, s1, first); break;
        case 2: pass<2>(x, w, bias, y, N, K, m0, s0, s1, first); break;
        case 3: pass<3>(x, w, bias, y, N, K, m0, s0, s1, first); break;
        case 4: pass<4>(x, w, bias, y, N, K, m0, s0, s1, first); break;
        case 5: pass<5>(x, w, bias, y, N, K, m0, s0, s1, first); break;
        default: pass<6>(x, w, bias, y, N, K, m0, s0, s1, first); break;
      }
    }
  }
}

}  // namespace

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
  // Split the weight rows between threads in pairs (the split does not change any result).
  const int64_t pairs = (N + 1) / 2;
  at::parallel_for(0, pairs, 32, [&](int64_t p0, int64_t p1) {
    rows(xp, wp, b, yp, M, N, K, p0 * 2, std::min(N, p1 * 2));
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv_f16", &gemv_f16, "fp16-weight GEMV for a few rows"); }
