// gguf_q8.inc and gguf_kq.inc built for CPUs with AVX512-VNNI (Zen 4, Ice Lake and later), chosen at run time, and
// the q16 path's products on AMX's tiles for passes of several rows (gguf_amx.inc), where the CPU has AMX-INT8 and
// the kernel lets this process use it (the rest: attention, activation blocks, a lone group, stays on the VNNI
// build). Only this file's own code is compiled for the wider targets: the headers come first, at the default one.
// A translation unit of its own, without torch's API (gguf_core.h), so that it compiles beside the others.
#define SPECDEC_LIGHT
#include "gguf_core.h"
#include "amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
namespace specdec::gguf::vnni {
using QMatrix = QView;
#define SPECDEC_VNNI 1
#include "gguf_q8.inc"
#include "gguf_kq.inc"
#undef SPECDEC_VNNI
SPECDEC_GGUF_INSTANTIATE
}  // namespace specdec::gguf::vnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,amx-tile,amx-int8")
namespace specdec::gguf::amx {
using QMatrix = QView;
using vnni::bytes16_ps;
using vnni::KqAt;
using vnni::load16h;
using vnni::load_kq_pair;
using vnni::pair_nibbles;
using vnni::prefetch_lines;
using vnni::store_pair;
#include "gguf_amx.inc"
}  // namespace specdec::gguf::amx
#pragma GCC pop_options
