// gguf_q8.inc and gguf_kq.inc built for AVX2 (the module's default target): gguf.cpp's integer products on CPUs
// without AVX512-VNNI, and on any CPU under set_isa("avx2"). A translation unit of its own, without torch's API
// (gguf_core.h), so that it compiles beside gguf.cpp and gguf_vnni.cpp.
#define SPECDEC_LIGHT
#include "gguf_core.h"

namespace specdec::gguf::avx2 {
using QMatrix = QView;
#define SPECDEC_VNNI 0
#include "gguf_q8.inc"
#include "gguf_kq.inc"
#undef SPECDEC_VNNI
SPECDEC_GGUF_INSTANTIATE
}  // namespace specdec::gguf::avx2
