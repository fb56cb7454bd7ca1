"""Weights and KV caches on huge pages (models/hugepages.py): placement only, never a different result."""

from __future__ import annotations

import pytest
import torch

from specdec.models import hugepages
from specdec.models.hugepages import PAGE, Arena

LINUX_THP = hugepages.enabled()


def test_arena_copies_tensors_exactly_on_cache_lines():
    arena = Arena(chunk=4 << 20)
    g = torch.Generator().manual_seed(0)
    src = [torch.randn(37, 5, generator=g), torch.randint(0, 255, (3000,), dtype=torch.uint8, generator=g),
           torch.randn(7, generator=g).half(), torch.zeros(0), torch.randn(600_000, generator=g)]  # the last: 2 chunks
    out = [arena.put(t) for t in src]
    for a, b in zip(src, out):
        assert b.dtype == a.dtype and b.shape == a.shape and b.is_contiguous() and torch.equal(a, b)
        assert b.data_ptr() % 64 == 0
    assert arena.put(None) is None
    z = arena.zeros((4, 3), torch.float16)
    assert z.dtype == torch.float16 and not z.any()
    out[1][0] = 7  # views of separate tensors never overlap
    assert torch.equal(out[0], src[0]) and torch.equal(out[2], src[2]) and int(out[1][0]) == 7


@pytest.mark.skipif(not LINUX_THP, reason="madvise(MADV_HUGEPAGE) exists only on Linux")
def test_chunks_start_on_huge_pages():
    arena = Arena(chunk=PAGE)
    first = arena.put(torch.ones(10))
    if not arena.advised:
        pytest.skip("this kernel refuses transparent huge pages")
    assert first.data_ptr() % PAGE == 0


def _rss_anon() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10
    pytest.skip("no /proc/self/status")


@pytest.mark.skipif(not LINUX_THP, reason="measures resident memory through Linux's /proc")
@pytest.mark.parametrize("blocked,hugepages", [(True, "1"), (True, "0"), (False, "1")])
def test_a_kv_pool_is_resident_only_where_written(blocked, hugepages, monkeypatch):
    """A server's pool is sized for the model's whole context (Gemma 3 270M: 4.5 GiB at 8 slots of 32k); it must
    not take that memory before sequences fill it, and what was never written reads as zeros."""
    from specdec.models.config import ModelConfig
    from specdec.models.kv_cache import KVCache

    cfg = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_position_embeddings=1 << 16)
    monkeypatch.setenv("SPECDEC_HUGEPAGES", hugepages)
    before = _rss_anon()
    cache = KVCache(cfg, 8, 1 << 16, dtype=torch.float16, blocked=blocked)  # native kernels' layout, or torch's
    nbytes = sum(t.numel() * t.element_size() for t in cache.k + cache.v)  # 256 MiB
    grew = _rss_anon() - before
    assert grew < nbytes / 8, f"{grew >> 20} MiB resident of a {nbytes >> 20} MiB pool nothing has written"
    cache.v[1][3, 1, 1000:1100] = 1.0  # [slot, kv head, positions, head_dim]  # a sequence writes some positions
    assert cache.v[1].sum() == 100 * 16 and not cache.k[3].any() and not cache.v[0][7].any()


@pytest.mark.skipif(not LINUX_THP, reason="measures resident memory through Linux's /proc")
def test_a_servers_pool_maps_little_for_a_fresh_slots_first_positions():
    """A scheduler's pool (Scheduler's default: the server's) is on 4 KB pages. On 2 MB pages a sequence's first
    positions mapped a huge page in every (layer, key or value, head) region it wrote: 180 MB and 56-466 ms for a
    fresh slot of the bundled model at --context 8192, where 4 KB pages took 1 MB (scripts/kv_pages_bench.py)."""
    from specdec.engine.scheduler import SchedulerConfig
    from specdec.models.config import ModelConfig
    from specdec.models.kv_cache import CHUNK, KVCache

    assert SchedulerConfig().kv_huge_pages is False
    cfg = ModelConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=64, max_position_embeddings=1 << 15)
    cache = KVCache(cfg, 4, 1 << 15, dtype=torch.float16, blocked=True, huge_pages=SchedulerConfig().kv_huge_pages)
    before = _rss_anon()
    for k, v in zip(cache.k, cache.v):  # a first prefill chunk of slot 2: 64 positions of every layer and head
        k[2, :, : 64 // CHUNK] = 1.0  # [slot, kv head, blocks, head_dim, CHUNK]
        v[2, :, :64] = 1.0  # [slot, kv head, positions, head_dim]
    grew = _rss_anon() - before
    assert grew < 2 << 20, f"{grew >> 10} KiB mapped for 64 KiB written (16 regions of 4 MiB each)"


def test_off_switch_gives_ordinary_tensors(monkeypatch):
    monkeypatch.setenv("SPECDEC_HUGEPAGES", "0")
    arena = Arena()
    assert not arena.advised
    t = torch.arange(10.0)
    assert torch.equal(arena.put(t), t) and arena.buf is None


@pytest.mark.parametrize("precision", ["gguf-q16", "fp16"])
def test_placement_never_changes_the_logits(precision, monkeypatch, tmp_path):
    from specdec.models.loader import load_model
    from tests.conftest import native_kernels
    from tests.test_gguf_kernels import logits_of, write_tiny_gguf

    native_kernels()  # built (or found) before the cache moves to tmp_path
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tinyq.gguf"
    write_tiny_gguf(path, all_quantized=True)
    ids = list(range(3, 30))
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SPECDEC_HUGEPAGES", flag)
        model = load_model(str(path), precision).model
        assert model.kernels is not None
        runs[flag] = logits_of(model, ids, 4)
    assert torch.equal(runs["0"], runs["1"])
