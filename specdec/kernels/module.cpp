// The module's torch-facing sources in one translation unit: torch/extension.h alone takes about 30 s to compile
// and the three files' own code a few more, so one unit instead of three saves a minute of a 2-core build. The
// integer kernels' builds (gguf_avx2.cpp, gguf_vnni.cpp) are units of their own, without torch's API, compiled
// beside this one. Each file keeps its own anonymous namespace, and none defines what another does.
#include "decode_f16.cpp"
#include "attention.cpp"
#include "gguf.cpp"
