"""Long contexts on the native kernels: the verify pass stays bit-equal to one-token passes at thousands of
positions (attention reads a sequence's cache once for all its rows, in key partitions merged in a fixed
order), agrees with the fp32 torch path, prefill writes the same cache however it is chunked, and the model's
whole context works with a clear error past it."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from tests.conftest import native_kernels, prefill_rows
from tests.test_engine_model import mismatch_report, verify_vs_one_token

VOCAB = 96
MAX_POS = 8192


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def long_model(tiny_model):
    native_kernels()
    model = tiny_model("fp16", vocab=VOCAB, std=0.1, max_pos=MAX_POS)
    assert model.kernels is not None
    return model


def test_verify_pass_equals_one_token_passes_at_2k_to_8k_positions(long_model):
    """Three sequences of 2k, 4k and 8k positions in one ragged pass, 6 rows each."""
    prompts = [tokens(n, s) for n, s in ((2050, 1), (4100, 2), (8180, 3))]
    drafts = [tokens(5, 10 + s) for s in range(3)]
    verify, single = verify_vs_one_token(long_model, prompts, drafts, capacity=MAX_POS)
    assert torch.equal(verify, single), mismatch_report(verify, single)


@pytest.mark.parametrize("hidden,heads", [(64, 4), (128, 2), (160, 2)], ids=["d16", "d64", "d80"])
def test_the_avx512_attention_gives_the_avx2_bits(tiny_model, hidden, heads):
    """Attention's 512-bit tiles (a key block's 64 keys, or 64 value dims; at d = 80 an AVX2 tile finishes each
    value row) run every lane's chain as the AVX2 tiles do, so a CPU's ISA never changes an output: a ragged
    verify pass over two partitions of keys, and a prefill, give the same bits either way."""
    if not native_kernels().cpu_has_vnni():
        pytest.skip("needs a CPU with AVX-512")
    model = tiny_model("fp16", vocab=VOCAB, std=0.1, max_pos=1024, hidden=hidden, heads=heads)
    prompts = [tokens(n, s) for n, s in ((600, 6), (300, 7))]
    drafts = [tokens(5, 16), tokens(2, 17)]
    out = {}
    for isa in ("avx2", "vnni"):
        before = model.kernels.set_isa(isa)
        try:
            cache, prefill = prefill_rows(model, [p[:-1] for p in prompts], capacity=700)
            rows = [[p[-1]] + d for p, d in zip(prompts, drafts)]
            pos = [len(p) - 1 + i for p, r in zip(prompts, rows) for i in range(len(r))]
            verify = model.forward_ragged(torch.tensor(sum(rows, [])), torch.tensor([0] * 6 + [1] * 3),
                                          torch.tensor(pos), cache)
            out[isa] = (prefill, verify)
        finally:
            model.kernels.set_isa(before)
    assert torch.equal(out["avx2"][0], out["vnni"][0]), "prefill"
    assert torch.equal(out["avx2"][1], out["vnni"][1]), "verify"


def test_long_context_attention_agrees_with_the_fp32_torch_path(tiny_model, long_model):
    """Partitioned attention over an fp16 cache against the torch path's fp32 attention over fp32 weights."""
    reference = tiny_model("fp32", vocab=VOCAB, std=0.1, max_pos=MAX_POS)
    seq = tokens(3000, 4)
    got, want = [], []
    for model, out in ((long_model, got), (reference, want)):
        cache = model.new_cache(1, 3100)
        model.forward(torch.tensor([seq[:-4]]), torch.zeros(1, dtype=torch.long), cache, prefill=True,
                      last_only=torch.tensor([len(seq) - 5]))
        out.append(model.forward(torch.tensor([seq[-4:]]), torch.tensor([len(seq) - 4]), cache)[0])  # [4, vocab]
    got, want = got[0], want[0]
    scale = want.std().item()
    assert (got - want).abs().max().item() < 0.05 * scale, f"max |diff| {(got - want).abs().max():.3g}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_prefill_writes_the_same_cache_however_it_is_chunked(long_model):
    """What makes prefix caching exact: one prefill call, 64-token chunks, and 100-token chunks after a run of
    one-token passes all leave the same keys and values."""
    seq = tokens(1000, 5)
    caches = []
    for pieces in ([1000], [64] * 15 + [40], [1] * 10 + [100] * 9 + [90]):
        cache, at = long_model.new_cache(1, 1024), 0
        for n in pieces:
            long_model.forward(torch.tensor([seq[at:at + n]]), torch.tensor([at]), cache, prefill=n > 1,
                               last_only=torch.tensor([n - 1]) if n > 1 else None)
            at += n
        caches.append(cache)
    for layer in range(len(caches[0].k)):
        for other in caches[1:]:
            assert torch.equal(caches[0].keys(layer)[:, :, :1000], other.keys(layer)[:, :, :1000])
            assert torch.equal(caches[0].values(layer)[:, :, :1000], other.values(layer)[:, :, :1000])


def test_the_whole_context_works_and_one_token_more_is_refused(long_model):
    engine = Engine(long_model, None)
    prompt = tokens(MAX_POS - 3, 6)
    out = engine.generate([prompt], GenerationConfig(10), k=1)[0]
    # every position is used: the prompt and 3 generated tokens fill 8192, and the 4th is sampled from the last
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    with pytest.raises(SpecdecError, match=f"prompt of {MAX_POS} tokens does not fit the model's context of "
                                           f"{MAX_POS}"):
        engine.generate([tokens(MAX_POS, 7)], GenerationConfig(10))


def test_bench_long_context_prices_attention_at_the_cache_types_rate_as_profile_does():
    """`bench long-context --kv-cache q8_0` holds TTFT to the floor `profile --prompt-tokens` prints (theory/floor.py):
    attention at the int8 rate where the type gives one, at the fp32 FMA rate on f16."""
    from types import SimpleNamespace

    from specdec.bench.hardware.long_context import pass_floor, prefill_floor
    from specdec.theory.floor import Rates

    cfg = SimpleNamespace(num_layers=2, num_heads=4, head_dim=64, vocab_size=100, hidden_size=256)
    model = SimpleNamespace(cfg=cfg, macs_per_token=1e6)
    f16, q8 = Rates(1e10, 1e9, 1e8), Rates(1e10, 1e9, 1e8, attention_rate=4e8)
    att = 2 * 4 * 64 * 2 * 1000 * 1001 / 2  # every position's keys, over a 1,000-token prompt
    products = (1000 * (1e6 - 100 * 256) + 100 * 256) / 1e9
    assert prefill_floor(model, f16, 1000) == pytest.approx(products + att / 1e8)
    assert prefill_floor(model, q8, 1000) == pytest.approx(products + att / 4e8)
    assert pass_floor(model, q8, 999) == pytest.approx(1e6 / 1e9 + 2 * 4 * 64 * 2 * 1000 / 4e8)
