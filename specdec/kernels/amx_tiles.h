// AMX's tile configuration (palette 1), shared by the products' tiles (gguf_amx.inc) and attention's
// (attention_amx.inc): each names the rows and bytes a row of the tiles it uses, then loads the configuration.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  TileConfig& tile(int t, int n_rows, int bytes) {
    rows[t] = uint8_t(n_rows);
    colsb[t] = uint16_t(bytes);
    return *this;
  }

  // The barrier keeps the stores above: without it GCC took ldtilecfg for a reader of one byte, dropped the rows, and
  // the first tile load faulted (SIGILL).
  __attribute__((target("amx-tile"))) void load() const {
    __asm__ volatile("" : : "r"(this) : "memory");
    _tile_loadconfig(this);
  }
};

}  // namespace specdec
