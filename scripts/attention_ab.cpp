// scripts/attention_ab.py's module: a kernels build's attention alone (its attention.cpp, included from the folder
// the script puts on the include path), on a synthetic cache, for timing one build against another.
#include <torch/extension.h>

namespace specdec {
extern bool amx_tiles __attribute__((weak));  // defined by builds whose attention has AMX tiles
}
#include "attention.cpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <random>

namespace {

// `bytes` of zeros on 2 MB pages where Linux grants them, as the engine's KV pool is (specdec/models/hugepages.py):
// 2 MB-aligned, so every block starts on a cache line and a stream of blocks crosses no 4 KB page. On the C heap,
// a cache started 16 bytes past a line and sat on 4 KB pages, and its passes read slower than the engine's do.
class Region {
 public:
  explicit Region(size_t bytes) {
    constexpr size_t PAGE = size_t(2) << 20;
    size = (bytes + PAGE - 1) / PAGE * PAGE + PAGE;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "cannot map ", bytes, " bytes for the cache");
    base = static_cast<uint8_t*>(p);
    uint8_t* at = base + (PAGE - reinterpret_cast<uintptr_t>(base) % PAGE) % PAGE;
    madvise(at, size - (at - base), MADV_HUGEPAGE);  // best effort: refused, the pages stay 4 KB
    data_ = at;
  }
  Region(Region&& o) noexcept : base(o.base), size(o.size), data_(o.data_) { o.base = nullptr; }
  Region(const Region&) = delete;
  ~Region() {
    if (base) munmap(base, size);
  }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* base = nullptr;  // the mapping, and its size
  size_t size = 0;
  uint8_t* data_ = nullptr;  // its first 2 MB boundary
};

// A cache of `layers` layers, `hk` KV heads of d dims, its first `fill` positions written with normal values.
struct Cache {
  std::vector<Region> k, v;  // per layer: the kernels' blocks, keys and values
  int64_t hk, cap, d;
  specdec::Kv kind;
};
std::vector<Cache> caches;

int64_t make_cache(int64_t layers, int64_t hk, int64_t cap, int64_t d, int64_t kind, int64_t fill) {
  TORCH_CHECK(layers >= 1 && hk >= 1 && d % 32 == 0 && cap % specdec::KB == 0 && 0 <= fill && fill <= cap,
              "a cache of at least one layer and head, dims a multiple of 32, capacity in whole blocks");
  Cache c{{}, {}, hk, cap, d, specdec::Kv(kind)};
  const int64_t bytes = hk * (cap / specdec::KB) * specdec::kv_block_bytes(c.kind, d);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> k(d), v(d);
  for (int64_t l = 0; l < layers; ++l) {
    c.k.emplace_back(bytes), c.v.emplace_back(bytes);
    for (int64_t g = 0; g < hk; ++g)
      for (int64_t p = 0; p < fill; ++p) {
        for (auto& x : k) x = normal(rng);
        for (auto& x : v) x = normal(rng);
        if (c.kind == specdec::Kv::F16)
          specdec::store_kv(k.data(), v.data(), reinterpret_cast<at::Half*>(c.k.back().data()),
                            reinterpret_cast<at::Half*>(c.v.back().data()), 0, g, p, hk, cap, d);
        else
          specdec::store_kv_q(k.data(), v.data(), c.k.back().data(), c.v.back().data(), c.kind, 0, g, p, hk, cap, d);
      }
  }
  caches.push_back(std::move(c));
  return int64_t(caches.size()) - 1;
}

// Seconds a pass of `rows` rows at positions pos.. takes over every layer (or over layer 0 every time: `one_layer`,
// whose cache then stays in the cores' caches), the mean of `reps` passes. out [rows, hq * d]: the last layer's output.
double run(int64_t id, int64_t hq, int64_t pos, int64_t rows, int64_t reps, bool one_layer, torch::Tensor out) {
  const Cache& c = caches.at(id);
  const int64_t d = c.d, qstride = (hq + 2 * c.hk) * d;
  TORCH_CHECK(out.is_contiguous() && out.numel() == rows * hq * d && out.scalar_type() == torch::kFloat32,
              "out: rows x hq x d floats");
  TORCH_CHECK(pos + rows <= c.cap && hq % c.hk == 0, "rows past the cache, or query heads not a multiple of KV heads");
  std::vector<float> qkv(rows * qstride);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (auto& x : qkv) x = normal(rng);
  std::vector<int64_t> slot(rows, 0), at(rows);
  for (int64_t r = 0; r < rows; ++r) at[r] = pos + r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t rep = 0; rep < reps; ++rep)
    for (size_t l = 0; l < c.k.size(); ++l) {
      const size_t L = one_layer ? 0 : l;
      specdec::attention(qkv.data(), qstride, slot.data(), at.data(), rows, c.k[L].data(), c.v[L].data(), c.kind, hq,
                         c.hk, c.cap, d, 1.f / std::sqrt(float(d)), 0, out.data_ptr<float>());
    }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// AMX's tiles for this build's attention, where the CPU has them (gguf.cpp grants them in the full module).
bool use_amx(bool on) {
  if (&specdec::amx_tiles == nullptr) return !on;
  if (on && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return false;
  specdec::amx_tiles = on;
  return true;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("make_cache", &make_cache);
  m.def("run", &run);
  m.def("use_amx", &use_amx);
}
