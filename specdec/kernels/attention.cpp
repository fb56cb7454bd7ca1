// Attention of a decode, verify or prefill pass over a ragged batch, on an fp16 KV cache (or a quantized one:
// attention_q.inc lays out q8_0 and q4_0 and says how their tiles keep the same invariance).
//
// fp16 cache layout (per layer): keys [slots, hk, cap / KB, d, KB] -- each block of KB positions stored transposed,
// so the scores of 8 consecutive keys are one vector FMA chain over d -- and values [slots, hk, cap, d].
//
// Memory: a unit of work is (slot, kv head, key partition, chunk of up to ROWS of that slot's rows). It reads
// the partition's keys and values once for every row of the chunk and every query head of the group, so a
// verify pass over k+1 rows reads a sequence's cache once, not k+1 times; rows whose position lies before a
// partition skip it (a prefill chunk skips the causal blocks above its diagonal).
//
// Invariance: a query's result is a fixed sequence of operations over its own position alone. Its keys are
// split into partitions at fixed absolute boundaries (multiples of SPLIT, or of SPLIT_Q on a quantized cache);
// within a partition its scores are FMA chains in ascending d, its softmax sums in ascending key order, its value
// sums in ascending key order; partitions merge in ascending order. Nothing depends on the other rows, their
// number, the tiling or threads.
#include "common.h"
#include "amx_tiles.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace specdec {

bool cpu_has_avx512() {
  __builtin_cpu_init();  // `wide` is set while the module loads, maybe before libgcc's own constructor
  return __builtin_cpu_supports("avx512f");
}
bool wide = cpu_has_avx512();
bool amx_tiles = false;  // gguf.cpp sets it as it loads (cpu_has_amx)

#ifndef SPLIT_KEYS
#define SPLIT_KEYS 256
#endif
constexpr int64_t SPLIT = SPLIT_KEYS;  // keys per partition: the unit of memory reuse and of parallel work
// A quantized cache's partitions are 4x as long: its integer tiles spend less per key, so a unit's fixed cost (its
// queries gathered, its softmax, its partial result and their merge) weighed more, and each thread now reads runs of
// keys and values 4x as long. On the bundled model at 3,300 positions (gguf-q8, scripts/kernel_ab.py --changed,
// 40 alternated repetitions, an EPYC Zen 4, 2026-12-06), a 1-row pass took 0.95x (q4_0) and 0.94x (q8_0) the time
// of 256's, a 6-row pass 0.98x and 0.96x, a 3,300-token prefill 0.91x and 0.92x; 2,048 decoded no faster than 1,024,
// and on an AMX Xeon 512, 768 and 2,048 came within 2.5% of 1,024.
constexpr int64_t SPLIT_Q = 1024;
constexpr int64_t ROWS = 16;    // rows of one slot per unit (bounds the score buffer)
constexpr int SV = 2;        // key vectors (8 keys each) per score tile
constexpr int VV = 2;        // value vectors (8 dims each) per value tile
constexpr int WV = 4;        // 512-bit vectors per AVX-512 tile: a key block's 64 keys, or 64 value dims
// Bytes a tile prefetches ahead of its loads, down the same stream of keys or values (one key block): the tiles
// waited on their first touch of each cache line where the hardware's own prefetch had not reached. Alternated in one
// process on gguf-q16 at 2,048 positions (per-pass ratios, 60-100 pairs), a pass took 0.91x (1 row) and 0.88x (6
// rows) of the time without it on the AVX-512 tiles, 0.81x and 0.91x on the AVX2 ones; at 512, 0.96x and 0.95x, 0.90x
// and 0.97x. Prefetches change no value.
constexpr int64_t AHEAD = 8192;
static_assert(KB == 16 * WV, "an AVX-512 score tile is one key block");

namespace {

// The cache line `bytes` past p (an address, never dereferenced: it may lie past the cache's end).
inline void prefetch_line(const at::Half* p, int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + bytes), _MM_HINT_T0);
}

// The same into L2 alone (a second, farther stream of prefetches: attention_q.inc's FAR_BLOCKS).
inline void prefetch_l2(const uint8_t* p, int64_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + bytes), _MM_HINT_T1);
}

struct Unit {
  int64_t slot, g, part, r0, r1;
};

// s[h][j] = scale * sum_i q[h][i] * kb[i][j] for the KB keys of one block (kb fp16 [d][KB], widened in registers),
// 8 NV keys at a time.
template <int NH, int NV>
void block_scores(const float* const* q, const at::Half* kb, int64_t d, float scale, float* const* s) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < KB; j += 8 * NV) {
    __m256 acc[NH][NV];
    for (int h = 0; h < NH; ++h)
      for (int v = 0; v < NV; ++v) acc[h][v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
      if (j % 32 == 0) prefetch_line(kb + i * KB + j, AHEAD);  // from the tile that first touches the line
      __m256 k[NV];
      for (int v = 0; v < NV; ++v) k[v] = load_w(kb + i * KB + j + 8 * v);
      for (int h = 0; h < NH; ++h) {
        const __m256 b = _mm256_broadcast_ss(q[h] + i);
        for (int v = 0; v < NV; ++v) acc[h][v] = _mm256_fmadd_ps(b, k[v], acc[h][v]);
      }
    }
    for (int h = 0; h < NH; ++h)
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(s[h] + j + 8 * v, _mm256_mul_ps(acc[h][v], sc));
  }
}

// acc[h][c, c + 8 NV) += sum_{j < n} e[h][j] * vb[j][c, c + 8 NV), in ascending j (vb fp16 [KB][d]).
template <int NH, int NV>
void block_values(const float* const* e, const at::Half* vb, int64_t n, int64_t d, int64_t c, float* const* acc) {
  __m256 a[NH][NV];
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) a[h][v] = _mm256_loadu_ps(acc[h] + c + 8 * v);
  for (int64_t j = 0; j < n; ++j) {
    if (c % 32 == 0) prefetch_line(vb + j * d + c, AHEAD / (2 * d) * 2 * d);  // the same dims, rows ahead
    __m256 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load_w(vb + j * d + c + 8 * v);
    for (int h = 0; h < NH; ++h) {
      const __m256 b = _mm256_broadcast_ss(e[h] + j);
      for (int v = 0; v < NV; ++v) a[h][v] = _mm256_fmadd_ps(b, x[v], a[h][v]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc[h] + c + 8 * v, a[h][v]);
}

// The same two tiles in 512-bit registers, for CPUs with AVX-512 (`wide`): 16 keys (or value dims) a vector where
// AVX2 holds 8. Each lane still runs its key's FMA chain over d (or its dim's over the keys) in ascending order with
// the same operands, so the results are the AVX2 tiles' bits; only the instructions issued halve. A tile spans a
// whole key block (or 64 value dims), so it reads each of the block's rows whole, front to back: tiles of 32 keys
// read every other 64 bytes of the fp16 rows in two sweeps, and a 1-row pass at 1,024 positions spent most of its
// score time waiting on those loads.
#pragma GCC push_options
#pragma GCC target("avx512f")
inline __m512 load16_w(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The two cache lines of an AVX-512 tile's fp16 row (64 keys or dims at p), `bytes` further down its stream.
inline void prefetch_row(const at::Half* p, int64_t bytes) {
  prefetch_line(p, bytes);
  prefetch_line(p, bytes + 64);
}

template <int NH, int NV>
void block_scores16(const float* const* q, const at::Half* kb, int64_t d, float scale, float* const* s) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < KB; j += 16 * NV) {
    __m512 acc[NH][NV];
    for (int h = 0; h < NH; ++h)
      for (int v = 0; v < NV; ++v) acc[h][v] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
      prefetch_row(kb + i * KB, AHEAD);
      __m512 k[NV];
      for (int v = 0; v < NV; ++v) k[v] = load16_w(kb + i * KB + j + 16 * v);
      for (int h = 0; h < NH; ++h) {
        const __m512 b = _mm512_set1_ps(q[h][i]);
        for (int v = 0; v < NV; ++v) acc[h][v] = _mm512_fmadd_ps(b, k[v], acc[h][v]);
      }
    }
    for (int h = 0; h < NH; ++h)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(s[h] + j + 16 * v, _mm512_mul_ps(acc[h][v], sc));
  }
}

template <int NH, int NV>
void block_values16(const float* const* e, const at::Half* vb, int64_t n, int64_t d, int64_t c, float* const* acc) {
  const int64_t ahead = AHEAD / (2 * d) * 2 * d;  // bytes: whole value rows, so the same dims
  __m512 a[NH][NV];
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) a[h][v] = _mm512_loadu_ps(acc[h] + c + 16 * v);
  for (int64_t j = 0; j < n; ++j) {
    prefetch_row(vb + j * d + c, ahead);
    __m512 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load16_w(vb + j * d + c + 16 * v);
    for (int h = 0; h < NH; ++h) {
      const __m512 b = _mm512_set1_ps(e[h][j]);
      for (int v = 0; v < NV; ++v) a[h][v] = _mm512_fmadd_ps(b, x[v], a[h][v]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc[h] + c + 16 * v, a[h][v]);
}

// exp256's instruction sequence on 16 lanes (the same operations, so each lane's bits are exp256's).
inline __m512 exp512(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447505531f);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                   _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(pow2));
}

// softmax_part's exponentials over s[0, n16) (n16 a multiple of 16), 16 at a time, added to acc 8 lanes at a time
// in ascending order: the AVX2 loop's sums.
inline __m256 exp_sum16(float* s, int64_t n16, float mx, __m256 acc) {
  const __m512 mxv = _mm512_set1_ps(mx);
  for (int64_t j = 0; j < n16; j += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mxv));
    _mm512_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  }
  return acc;
}
#pragma GCC pop_options

#include "attention_q.inc"

template <int NH>
void values_all(const float* const* e, const at::Half* vb, int64_t n, int64_t d, float* const* acc) {
  int64_t c = 0;
  if (wide)
    for (; c + 16 * WV <= d; c += 16 * WV) block_values16<NH, WV>(e, vb, n, d, c, acc);
  for (; c + 8 * VV <= d; c += 8 * VV) block_values<NH, VV>(e, vb, n, d, c, acc);
  for (; c < d; c += 8) block_values<NH, 1>(e, vb, n, d, c, acc);
}

template <int NH>
void scores_tile(const float* const* q, const at::Half* kb, int64_t d, float scale, float* const* s) {
  if (wide) block_scores16<NH, WV>(q, kb, d, scale, s);
  else block_scores<NH, SV>(q, kb, d, scale, s);
}

// Queries in tiles of up to 6 (the tile only decides which chains run side by side).
void scores_tiles(const float* const* q, int64_t nq, const at::Half* kb, int64_t d, float scale, float* const* s) {
  for (int64_t h = 0; h < nq; h += 6) {
    switch (std::min<int64_t>(6, nq - h)) {
      case 1: scores_tile<1>(q + h, kb, d, scale, s + h); break;
      case 2: scores_tile<2>(q + h, kb, d, scale, s + h); break;
      case 3: scores_tile<3>(q + h, kb, d, scale, s + h); break;
      case 4: scores_tile<4>(q + h, kb, d, scale, s + h); break;
      case 5: scores_tile<5>(q + h, kb, d, scale, s + h); break;
      default: scores_tile<6>(q + h, kb, d, scale, s + h); break;
    }
  }
}

// Queries [0, nq) with n[i] valid keys each, in tiles of up to 6 consecutive queries with the same count.
void values_tiles(const float* const* e, const int64_t* n, int64_t nq, const at::Half* vb, int64_t d,
                  float* const* acc) {
  for (int64_t h = 0; h < nq;) {
    int64_t t = 1;
    while (t < 6 && h + t < nq && n[h + t] == n[h]) ++t;
    switch (t) {
      case 1: values_all<1>(e + h, vb, n[h], d, acc + h); break;
      case 2: values_all<2>(e + h, vb, n[h], d, acc + h); break;
      case 3: values_all<3>(e + h, vb, n[h], d, acc + h); break;
      case 4: values_all<4>(e + h, vb, n[h], d, acc + h); break;
      case 5: values_all<5>(e + h, vb, n[h], d, acc + h); break;
      default: values_all<6>(e + h, vb, n[h], d, acc + h); break;
    }
    h += t;
  }
}

// exp(s - max) over the first n scores in place (the rest of the 8-lane group zeroed); returns the max and the
// sum, accumulated in ascending groups of 8 and then across lanes. Scores before `lo` (keys left of a sliding
// window) become 0 and count in neither the max nor the sum. With AVX-512 the exponentials of whole groups of
// 16 come from exp512, with the same bits and sums; alternated per pass on gguf-q16 at 2,048 positions, a 6-row pass
// took 0.95x the time (1 row 0.99x; at 512 positions no change).
void softmax_part(float* s, int64_t lo, int64_t n, float* mx_out, float* sum_out) {
  // The max is exact, so its order does not matter: four chains, since one waited on vmaxps's latency (a
  // 3,200-token prefill on q8_0 spent 4% of its time in that loop, perf, 2026-12-06).
  __m256 m4[4];
  for (int t = 0; t < 4; ++t) m4[t] = _mm256_set1_ps(-INFINITY);
  int64_t j0 = lo;
  for (; j0 + 32 <= n; j0 += 32)
    for (int t = 0; t < 4; ++t) m4[t] = _mm256_max_ps(m4[t], _mm256_loadu_ps(s + j0 + 8 * t));
  __m256 m8 = _mm256_max_ps(_mm256_max_ps(m4[0], m4[1]), _mm256_max_ps(m4[2], m4[3]));
  for (; j0 + 8 <= n; j0 += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j0));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float mx = -INFINITY;
  for (int t = 0; t < 8; ++t) mx = std::max(mx, lanes[t]);
  for (; j0 < n; ++j0) mx = std::max(mx, s[j0]);
  const __m256 mxv = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = lo / KB * KB;  // from the first key block the values read: every score they weigh is set here
  if (wide && lo == 0) {  // the same bits as the loop below
    j = n / 16 * 16;
    acc = exp_sum16(s, j, mx, acc);
  }
  for (; j < n; j += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mxv));
    if (j + 8 > n || j < lo) {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, e);
      for (int64_t t = 0; t < 8; ++t)
        if (j + t >= n || j + t < lo) tmp[t] = 0.f;
      e = _mm256_load_ps(tmp);
    }
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  *mx_out = mx;
  *sum_out = hsum(acc);
}

}  // namespace

int64_t kv_block_bytes(Kv kind, int64_t d) {
  return kind == Kv::F16 ? KB * d * 2 : kv_data_bytes(kind, d) + KB * (d / 32) * 2;
}

std::vector<std::string> kv_type_names() { return {"f16", "q8_0", "q4_0"}; }  // every CPU the kernels run on

void store_kv_q(const float* k_in, const float* v_in, uint8_t* kc, uint8_t* vc, Kv kind, int64_t slot, int64_t g,
                int64_t p, int64_t hk, int64_t cap, int64_t d) {
  const int64_t bb = kv_block_bytes(kind, d), B = d / 32, j = p % KB, at_block = ((slot * hk + g) * (cap / KB) + p / KB) * bb;
  uint8_t* kb = kc + at_block;
  uint8_t* vb = vc + at_block;
  at::Half* ks = reinterpret_cast<at::Half*>(kb + kv_data_bytes(kind, d));
  at::Half* vs = reinterpret_cast<at::Half*>(vb + kv_data_bytes(kind, d));
  float kr[256], vr[256];  // the key and value, rotated (attention_q.inc; d <= 256)
  std::copy_n(k_in, d, kr);
  std::copy_n(v_in, d, vr);
  rotate(kr, d);
  rotate(vr, d);
  const float* k = kr;
  const float* v = vr;
  int8_t q[32];
  for (int64_t b = 0; b < B; ++b) {
    if (kind == Kv::Q8) {
      ks[b * KB + j] = at::Half(quant8_32(k + 32 * b, q));
      for (int t = 0; t < 32; ++t) {
        const int64_t i = 32 * b + t;
        kb[(i / 4) * KB * 4 + j * 4 + i % 4] = uint8_t(q[t] + 128);
      }
      vs[b * KB + j] = at::Half(quant8_32(v + 32 * b, q));
      for (int t = 0; t < 32; ++t) vb[((j / 4) * d + 32 * b + t) * 4 + j % 4] = uint8_t(q[t]);
    } else {
      ks[b * KB + j] = at::Half(quant4_32(k + 32 * b, q));
      for (int g8 = 0; g8 < 4; ++g8)  // 8 dims a group: 4 bytes, dims 0-3 low, 4-7 high
        for (int t = 0; t < 4; ++t)
          kb[(4 * b + g8) * KB * 4 + j * 4 + t] = uint8_t(q[8 * g8 + t] | (q[8 * g8 + 4 + t] << 4));
      vs[b * KB + j] = at::Half(quant4_32(v + 32 * b, q));
      const int shift = j % 8 < 4 ? 0 : 4;  // keys 0-3 of each 8 in the low nibbles, 4-7 in the high
      for (int t = 0; t < 32; ++t) {
        uint8_t& byte = vb[((j / 8) * d + 32 * b + t) * 4 + j % 4];
        byte = uint8_t((byte & (0xF0 >> shift)) | (q[t] << shift));
      }
    }
  }
}

void store_kv(const float* k, const float* v, at::Half* kc, at::Half* vc, int64_t slot, int64_t g, int64_t p,
              int64_t hk, int64_t cap, int64_t d) {
  at::Half* kb = kc + ((slot * hk + g) * (cap / KB) + p / KB) * d * KB + p % KB;
  for (int64_t i = 0; i < d; ++i) kb[i * KB] = at::Half(k[i]);
  at::Half* vr = vc + ((slot * hk + g) * cap + p) * d;
  for (int64_t i = 0; i < d; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(vr + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
}

// q: row r's query head h at qkv + r * qstride + h * d. slot/pos [R]: a slot's rows are contiguous. out [R, hq*d].
// Scores are scaled by `scale`. window > 0: the query at position p sees the keys in (p - window, p] (Gemma 3's
// sliding layers), its own position's alone deciding which: partitions and key blocks wholly left of the window are
// skipped, and the keys left of it in the first block it reads weigh 0. softcap > 0 (Gemma 2): each scaled score s
// becomes softcap * tanh(s / softcap) before the softmax, as llama.cpp caps them.
void attention(const float* qkv, int64_t qstride, const int64_t* slot, const int64_t* pos, int64_t R,
               const void* kc_, const void* vc_, Kv kind, int64_t hq, int64_t hk, int64_t cap, int64_t d, float scale,
               int64_t window, float* out, float softcap) {
  const int64_t group = hq / hk, nblk = cap / KB, stride = d + 2, bb = kv_block_bytes(kind, d);
  const int64_t split = kind == Kv::F16 ? SPLIT : SPLIT_Q;
  const at::Half* kc = static_cast<const at::Half*>(kc_);  // the fp16 cache's
  const at::Half* vc = static_cast<const at::Half*>(vc_);
  const uint8_t* kq = static_cast<const uint8_t*>(kc_);  // a quantized one's
  const uint8_t* vq = static_cast<const uint8_t*>(vc_);
  static thread_local QQueries quantized;  // the queries quantized, for a quantized cache's integer scores
  QQueries& qq = quantized;  // this thread's, as the workers see it (a thread_local named in them is their own)
  if (kind != Kv::F16) qq.build(qkv, qstride, R, hq, d);
  std::vector<int64_t> low(R);  // row r's first visible key
  for (int64_t r = 0; r < R; ++r) low[r] = window > 0 ? std::max<int64_t>(0, pos[r] - window + 1) : 0;
  // whether row r sees a key in [k0, k0 + n)
  const auto sees = [&](int64_t r, int64_t k0, int64_t n) { return pos[r] >= k0 && low[r] < k0 + n; };
  int64_t parts = 1;
  std::vector<Unit> units;
  for (int64_t a0 = 0; a0 < R;) {
    int64_t a1 = a0 + 1, top = pos[a0];
    while (a1 < R && slot[a1] == slot[a0]) top = std::max(top, pos[a1++]);
    parts = std::max(parts, top / split + 1);
    for (int64_t g = 0; g < hk; ++g)
      for (int64_t part = 0; part <= top / split; ++part)
        for (int64_t r0 = a0; r0 < a1; r0 += ROWS) {
          const int64_t r1 = std::min(a1, r0 + ROWS);
          bool any = false;
          for (int64_t r = r0; r < r1; ++r) any |= sees(r, part * split, split);
          if (any) units.push_back({slot[a0], g, part, r0, r1});
        }
    a0 = a1;
  }
  std::vector<float> partial(R * hq * parts * stride);  // per (row, head, partition): max, sum, values [d]

  // Each thread takes a contiguous run of units with about equal work, counted in keys x rows: a decode pass at
  // 512 positions has units of 256, 256 and 1 key per KV head, which an even split of their count leaves 4 to 2.
  std::vector<int64_t> cost(units.size() + 1, 0);  // prefix sums
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& w = units[u];
    int64_t keys = 16;  // a unit's fixed cost, in keys
    for (int64_t r = w.r0; r < w.r1; ++r)
      if (sees(r, w.part * split, split))
        keys += std::min(pos[r] + 1, (w.part + 1) * split) - std::max(low[r], w.part * split);
    cost[u + 1] = cost[u] + keys;
  }
  const int64_t T = std::clamp<int64_t>(at::get_num_threads(), 1, std::max<int64_t>(1, units.size()));
  std::vector<int64_t> cut(T + 1, int64_t(units.size()));
  cut[0] = 0;
  for (int64_t t = 1; t < T; ++t) {  // the boundary nearest to t / T of the work
    const int64_t want = cost.back() * t / T;
    int64_t i = std::lower_bound(cost.begin(), cost.end(), want) - cost.begin();
    if (i > 0 && want - cost[i - 1] < cost[i] - want) --i;
    cut[t] = std::max(cut[t - 1], i);
  }

  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    // Per thread, grown once, so a pass allocates nothing. The scores need no clearing: a query reads only the
    // scores it wrote (its n keys), and softmax_part zeroes the rest of its last 8.
    static thread_local std::vector<float> s, acc;
    static thread_local std::vector<const float*> qp;
    static thread_local std::vector<float*> sp, ap;
    static thread_local std::vector<int64_t> nv, qi;
    s.resize(std::max(s.size(), size_t(ROWS * group * split)));
    acc.resize(std::max(acc.size(), size_t(ROWS * group * d)));
    qp.resize(std::max(qp.size(), size_t(ROWS * group)));
    sp.resize(std::max(sp.size(), size_t(ROWS * group)));
    ap.resize(std::max(ap.size(), size_t(ROWS * group)));
    nv.resize(std::max(nv.size(), size_t(ROWS * group)));
    qi.resize(std::max(qi.size(), size_t(ROWS * group)));
    const int64_t u0 = cut[t0], u1 = cut[t1];
    // Keys [first, hi) of unit w's partition are read, whole blocks from first's.
    const auto span = [&](const Unit& w) {
      const int64_t a = w.part * split;
      int64_t hi = a, first = a + split;
      for (int64_t r = w.r0; r < w.r1; ++r)
        if (sees(r, a, split)) {
          hi = std::max(hi, std::min(a + split, pos[r] + 1));
          first = std::min(first, std::max(a, low[r]) / KB * KB);
        }
      return std::make_pair(first, hi);
    };
    bool tiled = false;  // whether this thread configured AMX's tiles
    for (int64_t u = u0; u < u1; ++u) {
      const Unit& w = units[u];
      const int64_t a = w.part * split;
      const auto [first, hi] = span(w);
      const at::Half* kbase = kc + (w.slot * hk + w.g) * nblk * d * KB;
      const at::Half* vbase = vc + (w.slot * hk + w.g) * cap * d;
      const uint8_t* qbase = kq + (w.slot * hk + w.g) * nblk * bb;  // a quantized cache's blocks
      const uint8_t* vqbase = vq + (w.slot * hk + w.g) * nblk * bb;
      std::fill(acc.begin(), acc.begin() + (w.r1 - w.r0) * group * d, 0.f);
      // the queries (rows x heads of the group) that see the block at key0: pointers into q, scores, values
      auto gather = [&](int64_t key0, int64_t nk) {
        int64_t nq = 0;
        for (int64_t r = w.r0; r < w.r1; ++r) {
          if (!sees(r, key0, KB)) continue;
          for (int64_t h = 0; h < group; ++h, ++nq) {
            const int64_t i = (r - w.r0) * group + h;
            qp[nq] = qkv + r * qstride + (w.g * group + h) * d;
            qi[nq] = r * hq + w.g * group + h;
            sp[nq] = s.data() + i * split + (key0 - a);
            ap[nq] = acc.data() + i * d;
            nv[nq] = std::min(nk, pos[r] + 1 - key0);
          }
        }
        return nq;
      };
      // A unit of 16 rows on a quantized cache takes AMX's tiles for the blocks every row sees (attention_amx.inc).
      const bool tiles = kind != Kv::F16 && amx_tiles && wide && vnni_attention && w.r1 - w.r0 == 16 && d == 64;
      tiled |= tiles;
      if (tiles) tiles_for_scores();
      for (int64_t key0 = first; key0 < hi; key0 += KB) {  // scores, block by block
        const int64_t nq = gather(key0, KB);
        const bool whole = tiles && nq == 16 * group;  // every row of the unit sees the block
        if (whole && kind == Kv::Q8)
          scores_amx<false>(qq, w.r0, hq, w.g, group, qbase + (key0 / KB) * bb, scale, sp.data());
        else if (whole) scores_amx<true>(qq, w.r0, hq, w.g, group, qbase + (key0 / KB) * bb, scale, sp.data());
        else if (kind == Kv::F16) scores_tiles(qp.data(), nq, kbase + (key0 / KB) * d * KB, d, scale, sp.data());
        else if (kind == Kv::Q8) scores_tiles_q<false>(qq, qi.data(), nq, qbase + (key0 / KB) * bb, scale, sp.data());
        else scores_tiles_q<true>(qq, qi.data(), nq, qbase + (key0 / KB) * bb, scale, sp.data());
      }
      for (int64_t r = w.r0; r < w.r1; ++r) {
        if (!sees(r, a, split)) continue;
        const int64_t n = std::min(a + split, pos[r] + 1) - a, lo = std::max<int64_t>(0, low[r] - a);
        for (int64_t h = 0; h < group; ++h) {
          float* dst = partial.data() + ((r * hq + w.g * group + h) * parts + w.part) * stride;
          float* sr = s.data() + ((r - w.r0) * group + h) * split;
          if (softcap > 0.f)
            for (int64_t j = lo; j < n; ++j) sr[j] = softcap * std::tanh(sr[j] / softcap);
          softmax_part(sr, lo, n, dst, dst + 1);
        }
      }
      if (tiles) tiles_for_values();
      for (int64_t key0 = first; key0 < hi; key0 += KB) {  // values, block by block
        const int64_t nk = std::min(KB, hi - key0);
        const int64_t nq = gather(key0, nk);
        const bool whole = tiles && nq == 16 * group;
        if (kind == Kv::F16) values_tiles(sp.data(), nv.data(), nq, vbase + key0 * d, d, ap.data());
        else if (kind == Kv::Q8)
          values_tiles_q<false>(sp.data(), nv.data(), nq, vqbase + (key0 / KB) * bb, d, ap.data(), whole);
        else values_tiles_q<true>(sp.data(), nv.data(), nq, vqbase + (key0 / KB) * bb, d, ap.data(), whole);
      }
      for (int64_t r = w.r0; r < w.r1; ++r) {
        if (!sees(r, a, split)) continue;
        for (int64_t h = 0; h < group; ++h) {
          float* dst = partial.data() + ((r * hq + w.g * group + h) * parts + w.part) * stride;
          std::copy_n(acc.data() + ((r - w.r0) * group + h) * d, d, dst + 2);
        }
      }
    }
    if (tiled) tiles_done();
  });

  at::parallel_for(0, R * hq, 64, [&](int64_t t0, int64_t t1) {  // merge the partitions, in ascending order
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / hq, p0 = low[r] / split, np = pos[r] / split + 1;  // the partitions it sees
      const float* p = partial.data() + t * parts * stride;
      float mx = -INFINITY;
      for (int64_t i = p0; i < np; ++i) mx = std::max(mx, p[i * stride]);
      float den = 0.f;
      float* o = out + t * d;
      for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_setzero_ps());
      for (int64_t i = p0; i < np; ++i) {
        const float wgt = std::exp(p[i * stride] - mx);
        den += p[i * stride + 1] * wgt;
        const __m256 wv = _mm256_set1_ps(wgt);
        for (int64_t c = 0; c < d; c += 8)
          _mm256_storeu_ps(o + c, _mm256_fmadd_ps(_mm256_loadu_ps(p + i * stride + 2 + c), wv, _mm256_loadu_ps(o + c)));
      }
      const __m256 dv = _mm256_set1_ps(den);
      for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_div_ps(_mm256_loadu_ps(o + c), dv));
      if (kind != Kv::F16) rotate(o, d);  // a quantized cache's values were rotated: the sum turned back
    }
  });
}

}  // namespace specdec
