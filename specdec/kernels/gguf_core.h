// What gguf.cpp's products share with the integer kernels' builds (gguf_avx2.cpp, gguf_vnni.cpp): a weight
// matrix's planes as pointers (QView), the activation blocks (Q8Rows), the loads, and each build's entry points.
// No torch API here (SPECDEC_LIGHT): a build's translation unit compiles in seconds, where torch/extension.h alone
// takes half a minute, and the three compile side by side.
#pragma once
#include <immintrin.h>

#include "common.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace specdec::gguf {

constexpr int64_t QB = 32;  // weights per block

// A weight matrix [N, K] in blocks of 32 along K, with rows in groups of 8 interleaved (padded with zero rows to a
// multiple of 8), so that one register holds 4 consecutive weights of each of 8 rows and an 8-lane accumulator
// holds 8 outputs. For group G and block b, register g (g = 0..7) holds bytes [4 j + t] = q[row 8G + j][4 g + t]:
//   4-bit: q uint8 [N/8, K/32, 4, 32], chunk c holding register c in its low nibbles and register c + 4 in its
//          high nibbles; d and m fp16 [N/8, K/32, 8]; w = d q + m (Q4_0 is held as m = -8 d, which is exact).
//          `paired`: groups side by side in pairs (a zero group pads an odd count), q [G/2, K/32, 4, 2, 32] and d, m
//          [G/2, K/32, 2, 8]: a pair's block is 256 contiguous bytes, one 512-bit load holds chunk c of both groups,
//          and a pass that takes two groups at a time reads one stream. The VNNI build, which does, runs on it (the
//          model asks for it where that build runs); the AVX2 build, a group at a time, ran 7 to 25% slower on it
//          than on its own layout. Both builds compute either layout, with the same results;
//   8-bit: q int8 [N/8, K/32, 8, 32], d fp16 [N/8, K/32, 8]; w = d q. `paired` as for 4-bit: q [G/2, K/32, 8, 2, 32]
//          (a pair's block 512 bytes, chunk c register c of both groups), d [G/2, K/32, 2, 8].
// models/gguf/weights.py writes these planes from the file's blocks.
// QView is the matrix as the kernels read it; gguf.cpp's QMatrix holds its tensors.
struct QView {
  int64_t bits, N, K, G, B;  // G groups of 8 rows, B blocks a row; bits 4, 5, 6 or 8
  bool rows;  // the exact path's layout instead: row by row, q [N, K/32, 16 or 32], d and m [N, K/32]
  int64_t act_bits;  // interleaved layout: activation blocks of 8 bits (q8) or 15 bits in two planes (q16)
  bool paired;  // interleaved only: groups stored in pairs (see above)
  int64_t scales = 0;  // 0: d (and m) fp16 a block; 1 (Q4_K, Q5_K) and 2 (Q6_K): super-block scales (gguf_kq.inc)
  const uint8_t* qp_ = nullptr;
  const at::Half* dp_ = nullptr;
  const at::Half* mp_ = nullptr;
  const uint8_t* hp_ = nullptr;  // gguf_kq.inc's high-bit plane
  const uint8_t* sp_ = nullptr;  // gguf_kq.inc's integer-scale plane
  // The 5- and 6-bit and K-quant formats of gguf_kq.inc (interleaved, not paired).
  bool kq() const { return bits == 5 || bits == 6 || scales != 0; }
  // Group g, block b, for a matrix whose layout is PAIRED (= paired, a constant in the kernels' inner loops): chunk c
  // of its quants at qblock + c * (PAIRED ? 64 : 32), its 8 scales (and minimums) at dblock (mblock).
  template <bool PAIRED>
  const uint8_t* qblock(int64_t g, int64_t b) const {
    const int64_t block = bits == 8 ? 256 : 128;  // one group's bytes a block (5 and 6 bits: their nibbles)
    return PAIRED ? qp_ + ((g / 2) * B + b) * 2 * block + 32 * (g % 2) : qp_ + (g * B + b) * block;
  }
  template <bool PAIRED>
  int64_t scale_at(int64_t g, int64_t b) const {
    return PAIRED ? ((g / 2) * B + b) * 16 + 8 * (g % 2) : (g * B + b) * 8;
  }
  template <bool PAIRED>
  const at::Half* dblock(int64_t g, int64_t b) const { return dp_ + scale_at<PAIRED>(g, b); }
  template <bool PAIRED>
  const at::Half* mblock(int64_t g, int64_t b) const { return mp_ + scale_at<PAIRED>(g, b); }
};

// x [M, K] quantized per row in blocks of 32, block-major: a tile's rows of one block lie side by side, so it reaches
// them from one pointer at fixed offsets. Row-major, the tile kept a pointer per row and plane, more than the
// registers hold, and reloaded them from the stack every block; block-major ran a 6-row gguf-q16 pass in 0.95x the
// time (1 row 0.99x), alternated in one process.
struct Q8Rows {
  int64_t M, K, B, P;  // P planes: 1 (q8) or 2 (q16)
  std::vector<int8_t> q;  // [B, M, P, 32]: q8's quants; q16: plane 0 q and plane 1 q2, Q = 128 q + q2
  std::vector<float> d, s;  // [B, M]: scale of a unit of Q (q8: of q), and that scale * sum of the block's Q
  std::vector<int32_t> qsum;  // [B, M]: the sum of the block's Q, at most 32 (128 * 127 + 64) in size
  std::vector<int32_t> qlo;  // [B, M]: the sum of its first 16 Q (Q6_K's halves, gguf_kq.inc)
};

inline __m256 load8h(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The 8 registers of group g's block b (bytes [4 j + t] = weight 4 k + t of row j), as unsigned 0..15 or int8.
// PAIRED: the matrix's layout (the chunk stride, a constant in the loads).
template <bool PAIRED>
inline void load_group(const QView& W, int64_t g, int64_t b, __m256i r[8]) {
  const uint8_t* q = W.qblock<PAIRED>(g, b);
  if (W.bits == 4) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (PAIRED ? 64 : 32) * c));
      r[c] = _mm256_and_si256(raw, low);
      r[c + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
  } else {
    for (int c = 0; c < 8; ++c) r[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + (PAIRED ? 64 : 32) * c));
  }
}

// Each build's entry points (gguf_avx2.cpp; gguf_vnni.cpp, with AMX's): groups [g0, g1) of W's rows against the
// activation blocks a, into y [M, N].
#define SPECDEC_GGUF_BUILD                                                                \
  template <bool Q16>                                                                     \
  void q8_rows(const Q8Rows& a, const QView& W, float* y, int64_t g0, int64_t g1);        \
  template <bool Q16>                                                                     \
  void kq_rows(const Q8Rows& a, const QView& W, float* y, int64_t g0, int64_t g1);        \
  double dot_peak(double seconds);
namespace avx2 { SPECDEC_GGUF_BUILD }
namespace vnni { SPECDEC_GGUF_BUILD }
#undef SPECDEC_GGUF_BUILD
// The same, instantiated in a build's own translation unit, after its .inc files.
#define SPECDEC_GGUF_INSTANTIATE                                                        \
  template void q8_rows<true>(const Q8Rows&, const QView&, float*, int64_t, int64_t);  \
  template void q8_rows<false>(const Q8Rows&, const QView&, float*, int64_t, int64_t); \
  template void kq_rows<true>(const Q8Rows&, const QView&, float*, int64_t, int64_t);  \
  template void kq_rows<false>(const Q8Rows&, const QView&, float*, int64_t, int64_t);
namespace amx {
void amx_rows(const Q8Rows& a, const QView& W, float* y, int64_t g0, int64_t g1);
void amx_rows8(const Q8Rows& a, const QView& W, float* y, int64_t g0, int64_t g1);  // q8, one plane
void kq_amx_rows(const Q8Rows& a, const QView& W, float* y, int64_t g0, int64_t g1);  // Q6_K: VNNI's
}

}  // namespace specdec::gguf
