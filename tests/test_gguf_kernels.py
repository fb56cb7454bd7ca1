"""The native kernels on a GGUF's own blocks (kernels/gguf.cpp, `--precision gguf`, `gguf-q16` and `gguf-q8`).

Against gguf-py, the reference for what the blocks mean: the exact path multiplies by exactly the weights gguf-py
dequantizes, and the integer paths compute what their definition says (activation blocks of 8 or 15 bits, integer
dot products), checked against a written-out numpy version. Every row's result is bit for bit the same whatever the
other rows. The fast tests use random blocks and a tiny llama GGUF; the bundled model is in
test_engine_model/greedy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.models.gguf.weights import QTensor, dequantize, planes
from tests.test_gguf_convert import write_tiny_gguf


def random_qtensor(kind: str, rows: int, cols: int, seed: int) -> QTensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[0, :32] = np.linspace(-1, 1, 32)  # a block that uses the whole range, extremes included
    blocks = quantize(w, GGMLQuantizationType[kind])
    return QTensor(kind, blocks.reshape(rows, -1), rows, cols)


def int_reference(x: np.ndarray, parts: list[QTensor], act_bits: int = 8) -> np.ndarray:
    """The integer paths by their definition, in float64: activations per row in blocks of 32, v = x (127 /
    max|x|) in fp32, q8: q_a = round(v), q16: Q_a = round(128 v) (half to even), with d_a = max|x| / 127 (q16: a
    unit of Q is d_a / 128); weights as stored; y = sum_b d_w d_a (q_w . q_a) + m_w d_a sum(q_a)."""
    w = dequantize(parts).double().numpy()  # d q + m, so q_w . q_a d_w + m_w sum(q_a) is w . q_a
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    fine = 128 if act_bits == 16 else 1
    qa = np.rint((xb * inv).astype(np.float32) * np.float32(fine)).astype(np.float64)  # np.rint: half to even
    da = (amax / np.float32(127)).astype(np.float32).astype(np.float64) / fine
    return (qa * da).reshape(x.shape[0], -1) @ w.T


KINDS = [["Q4_0"], ["Q4_1"], ["Q8_0"], ["Q4_0", "Q4_1"]]  # the last: a fused matrix of two kinds


@pytest.mark.parametrize("kinds", KINDS, ids="+".join)
def test_exact_path_uses_exactly_the_files_weights(kernels, kinds):
    parts = [random_qtensor(k, 13, 96, seed=i) for i, k in enumerate(kinds)]  # 13 rows: not a multiple of 8
    expected = dequantize(parts)  # [N, K], gguf-py's values
    qm = kernels.QMatrix(*planes(parts, interleave=False))
    eye = torch.eye(qm.K)
    many = kernels.gemm_gguf(eye, qm)  # [K, N]: the prefill path
    few = torch.cat([kernels.gemm_gguf(eye[i:i + 5], qm) for i in range(0, qm.K, 5)])  # the few-row path
    assert torch.equal(many.T, expected) and torch.equal(few.T, expected)


@pytest.mark.parametrize("act_bits", [8, 16], ids=["q8", "q16"])
@pytest.mark.parametrize("kinds", KINDS, ids="+".join)
def test_integer_paths_compute_their_definition(kernels, kinds, act_bits, isa, paired):
    parts = [random_qtensor(k, 21, 128, seed=10 + i) for i, k in enumerate(kinds)]  # 3 groups: a padded pair
    qm = kernels.QMatrix(*planes(parts, interleave=True, act_bits=act_bits, paired=paired))
    computes_the_definition(kernels, qm, parts, act_bits, finer=50)


def computes_the_definition(kernels, qm, parts: list[QTensor], act_bits: int, finer: float) -> None:
    """qm's products of 17 activation rows (two VNNI tiles and a remainder; an all-zero block, a block 1000 times
    the others) equal int_reference's; q16's are `finer` times closer to the fp32 product than q8's reference."""
    x = np.random.default_rng(1).standard_normal((17, parts[0].cols)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block (scale 0)
    x[1, 32:64] *= 1000  # a block far larger than the others
    got = kernels.gemm_gguf(torch.from_numpy(x), qm).double().numpy()
    ref = int_reference(x, parts, act_bits)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    if act_bits == 16:  # 128 times finer than q8: nearly the fp32 product on the same weights
        exact = x.astype(np.float64) @ dequantize(parts).double().numpy().T
        q8 = int_reference(x, parts, 8)
        assert np.abs(got - exact).max() < np.abs(q8 - exact).max() / finer


@pytest.mark.parametrize("act_bits", [None, 8, 16], ids=["exact", "q8", "q16"])
def test_a_product_split_between_threads_is_the_whole_product(kernels, act_bits, isa, paired):
    """The small matrices above fit one thread's share; 400 weight rows (50 groups) are split between the threads,
    and each thread's part must equal the same rows computed on one thread (the state a product keeps per call,
    such as its quantized activations, belongs to the caller, not to the thread that reads it)."""
    parts = [random_qtensor("Q4_1", 400, 128, seed=8)]
    qm = kernels.QMatrix(*planes(parts, interleave=act_bits is not None, act_bits=act_bits or 8, paired=paired))
    x = torch.randn(17, 128, generator=torch.Generator().manual_seed(9))
    two = split_equals_one_thread(kernels, qm, x)
    if act_bits is not None:
        ref = int_reference(x.numpy(), parts, act_bits)
        assert np.abs(two[-1].double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


def split_equals_one_thread(kernels, qm, x: torch.Tensor) -> list[torch.Tensor]:
    """The products of 1, 6 and 17 rows of x on two threads, each checked equal to the same on one thread."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [kernels.gemm_gguf(x[:m], qm) for m in (1, 6, 17)]
        torch.set_num_threads(max(2, threads))
        two = [kernels.gemm_gguf(x[:m], qm) for m in (1, 6, 17)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    return two


def test_q16_needs_its_second_plane(kernels):
    """The definition check has teeth for q16 too: the same matrix on one activation plane (q8, rescaled) is far
    from q16's reference."""
    parts = [random_qtensor("Q4_1", 16, 64, seed=6)]
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    one_plane = kernels.gemm_gguf(torch.from_numpy(x), kernels.QMatrix(*planes(parts, True, 8))).double().numpy()
    ref = int_reference(x, parts, 16)
    assert np.abs(one_plane - ref).max() > 1e-3 * np.abs(ref).max()


def test_a_broken_nibble_order_fails_the_q8_check(kernels, isa):
    """The check above has teeth: the same blocks with each block's two nibble halves swapped are caught."""
    part = random_qtensor("Q4_1", 16, 64, seed=3)
    swapped = part.blocks.reshape(16, 2, 20).copy()
    swapped[:, :, 4:] = (swapped[:, :, 4:] >> 4) | ((swapped[:, :, 4:] & 0x0F) << 4)
    broken = QTensor("Q4_1", swapped.reshape(16, -1), 16, 64)
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    got = kernels.gemm_gguf(torch.from_numpy(x), kernels.QMatrix(*planes([broken], True))).double().numpy()
    ref = int_reference(x, [part])
    assert np.abs(got - ref).max() > 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("act_bits", [None, 8, 16], ids=["exact", "q8", "q16"])
def test_rows_do_not_depend_on_the_other_rows(kernels, act_bits, isa, paired):
    parts = [random_qtensor("Q4_1", 40, 96, seed=5)]
    qm = kernels.QMatrix(*planes(parts, interleave=act_bits is not None, act_bits=act_bits or 8, paired=paired))
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([kernels.gemm_gguf(x[i:i + 1], qm) for i in range(40)])
    for m in (2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 40):  # tiles of 4 (AVX2) or 8 (VNNI), their remainders, prefill
        assert torch.equal(kernels.gemm_gguf(x[:m], qm), alone[:m]), f"{m} rows"
    assert torch.equal(kernels.gemm_gguf(x.flip(0), qm).flip(0), alone)


@pytest.mark.parametrize("act_bits", [8, 16], ids=["q8", "q16"])
@pytest.mark.parametrize("kinds", [["Q4_1"], ["Q8_0"]], ids="+".join)
def test_the_vnni_build_gives_the_avx2_builds_bits(kernels, kinds, act_bits, paired):
    """The two builds sum the same integers and scale them in the same order (the VNNI build two weight groups at a
    time in 512-bit registers), so a machine's ISA never changes an output."""
    if not kernels.cpu_has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: only the AVX2 build runs here")
    x = torch.randn(19, 256, generator=torch.Generator().manual_seed(7)) * 3
    for n in (37, 13):  # groups of 8 rows in pairs and one alone; one pair whose second group is part padding
        parts = [random_qtensor(k, n, 256, seed=20 + i) for i, k in enumerate(kinds)]
        qm = kernels.QMatrix(*planes(parts, interleave=True, act_bits=act_bits, paired=paired))
        before = kernels.set_isa("avx2")
        try:
            want = [kernels.gemm_gguf(x[:m], qm) for m in range(1, 20)]
            kernels.set_isa("vnni")
            got = [kernels.gemm_gguf(x[:m], qm) for m in range(1, 20)]
        finally:
            kernels.set_isa(before)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{n} rows"


@pytest.mark.parametrize("act_bits", [16, 8], ids=["q16", "q8"])
@pytest.mark.parametrize("kind", ["Q4_1", "Q4_0", "Q8_0"])
def test_the_amx_tiles_give_the_vnni_builds_bits(kernels, kind, act_bits):
    """AMX's tiles sum the same integers as the VNNI build's dot products, and each lane then scales them in q8_pair's
    order, so the products are its bits: at every number of rows (q16's tiles take 5 or more, in tiles of 8 rows and a
    remainder; q8's 16 or more, in tiles of 16 and a remainder of up to 15 on the VNNI build), for two pairs at a time,
    a last pair, a last group alone and a pair whose second group is padding, on one thread and split between two."""
    if not kernels.cpu_has_amx():
        pytest.skip("this CPU has no AMX-INT8 (or the kernel does not grant it)")
    x = torch.randn(56, 256, generator=torch.Generator().manual_seed(12)) * 3
    x[3, :32] = 0.0  # an all-zero block
    x[20, 32:64] = 0.0  # and one in q8's second tile
    rows = list(range(1, 20)) + [40] if act_bits == 16 else [1, 8, 15, 16, 17, 23, 24, 31, 32, 33, 47, 56]
    for n in (48, 37, 13, 400):  # 6 groups: 2 pairs + 1; 5: 2 pairs + a group alone; 2 groups, 13 live rows; split
        qm = kernels.QMatrix(*planes([random_qtensor(kind, n, 256, seed=40)], True, act_bits, paired=True))
        amx_gives_vnnis_bits(kernels, qm, x, rows, f"{kind} {n} q{act_bits}")


def amx_gives_vnnis_bits(kernels, qm, x: torch.Tensor, rows: list[int], what: str) -> None:
    """qm's products of x's first m rows, for each m in rows: on AMX (both threads, and one alone) the VNNI build's
    bits."""
    threads = torch.get_num_threads()
    before = kernels.set_isa("vnni")
    try:
        want = [kernels.gemm_gguf(x[:m], qm) for m in rows]
        kernels.set_isa("amx")
        got = [kernels.gemm_gguf(x[:m], qm) for m in rows]
        torch.set_num_threads(1)
        alone = [kernels.gemm_gguf(x[:m], qm) for m in rows]
    finally:
        torch.set_num_threads(threads)
        kernels.set_isa(before)
    for m, g, a, w in zip(rows, got, alone, want):
        assert torch.equal(g, w) and torch.equal(a, w), f"{what} x {m}"


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("act_bits", [8, 16], ids=["q8", "q16"])
def test_pairs_of_groups_give_the_group_layouts_bits(kernels, act_bits, isa, kind):
    """The layout is the machine's choice, never the output's: weights stored in pairs of groups (4-bit and 8-bit)
    give the bits of the same weights stored group by group, at every number of rows, an odd number of groups
    included."""
    x = torch.randn(19, 256, generator=torch.Generator().manual_seed(11))
    for n in (40, 37, 13):
        parts = [random_qtensor(kind, n, 256, seed=30)]
        groups, pairs = (kernels.QMatrix(*planes(parts, True, act_bits, paired=p)) for p in (False, True))
        assert pairs.paired and not groups.paired
        for m in range(1, 20):
            assert torch.equal(kernels.gemm_gguf(x[:m], pairs), kernels.gemm_gguf(x[:m], groups)), f"{n} x {m}"


def test_set_isa_refuses_what_it_cannot_run(kernels):
    with pytest.raises(RuntimeError, match="auto, avx2, vnni or amx"):
        kernels.set_isa("avx512")
    if not kernels.cpu_has_amx():
        with pytest.raises(RuntimeError, match="no AMX-INT8"):
            kernels.set_isa("amx")
    before = kernels.set_isa("auto")
    best = "amx" if kernels.cpu_has_amx() else "vnni" if kernels.cpu_has_vnni() else "avx2"
    assert kernels.set_isa(before) == best
    rate = kernels.int8_peak(0.05)  # multiply-adds per second, measured: the fast suite bounds no measured rate
    assert math.isfinite(rate) and rate > 0


def test_the_floors_peaks_run_the_widest_vector_the_kernels_do(kernels):
    """fma_peak and int8_peak are the vector units' peaks at the width the kernels issue (512 bits with AVX-512:
    attention's tiles do, and an Intel core runs them at twice the 256-bit rate), so no kernel beats a floor built
    on them. Against the AVX2 build's (set_isa), the wide ones may be as fast (a Zen 4 splits 512-bit operations) or
    up to about 2x (int8 up to about 4x: AVX2 spends three instructions on 256 bits where VNNI spends one on 512;
    3.6x on an AMX Xeon), not much slower, and never as fast as chains GCC merged would read (12 chains counted,
    one run: 12x). One thread (a neighbour on the other core slows both arms alike), builds alternated 3 times, the
    best of each."""
    if not kernels.cpu_has_vnni():
        pytest.skip("the wide build needs AVX512-VNNI")
    before, threads = kernels.set_isa("vnni"), torch.get_num_threads()
    torch.set_num_threads(1)
    rates = {"vnni": [], "avx2": []}
    try:
        for _ in range(3):
            for isa in rates:
                kernels.set_isa(isa)
                rates[isa].append((kernels.fma_peak(0.02), kernels.int8_peak(0.02)))
    finally:
        kernels.set_isa(before)
        torch.set_num_threads(threads)
    (wide_fma, wide_int8), (fma, int8) = ([max(r[i] for r in rates[isa]) for i in (0, 1)] for isa in rates)
    assert 0.6 < wide_fma / fma < 3.0, (wide_fma, fma)
    assert 0.6 < wide_int8 / int8 < 6.0, (wide_int8, int8)


# ---- the model on a tiny all-quantized GGUF ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_q(tmp_path_factory):
    path = tmp_path_factory.mktemp("ggufq") / "tinyq.gguf"
    write_tiny_gguf(path, all_quantized=True)
    return path


@pytest.fixture
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


def logits_of(model, ids: list[int], chunk: int) -> torch.Tensor:
    cache = model.new_cache(1, 64)
    out = [model.forward(torch.tensor([ids[s:s + chunk]]), torch.tensor([s]), cache)[0]
           for s in range(0, len(ids), chunk)]
    return torch.cat(out)  # [len(ids), vocab]


def test_tiny_gguf_runs_on_its_own_blocks(kernels, tiny_q, cache_here):
    from specdec.models.loader import load_model

    ids = list(range(3, 40))
    ref = load_model(str(tiny_q), "fp32").model
    assert load_model(str(tiny_q)).model.precision in ("gguf-q16", "gguf-q8")  # the faster here, by default
    want = logits_of(ref, ids, len(ids))
    # gguf: the fp16 KV cache is the only difference; gguf-q16: and activations 128 times finer than q8's
    for precision, tol in (("gguf", 2e-3), ("gguf-q16", 2e-3), ("gguf-q8", 5e-2)):
        model = load_model(str(tiny_q), precision).model
        assert model.precision == precision and model.exact_kv_reuse
        assert model.weight_bytes_per_token < ref.weight_bytes_per_token / 4
        one = logits_of(model, ids, 1)
        assert torch.equal(logits_of(model, ids, 6), one)  # a verify pass equals one-token passes
        assert torch.equal(logits_of(model, ids, len(ids)), one)  # and a prefill
        err = float((one - want).abs().max() / want.abs().max())
        assert err < tol, f"{precision}: {err:.2e} from the fp32 model"


def test_one_call_a_pass_is_the_block_by_block_loop(kernels, tiny_q, cache_here, monkeypatch):
    from specdec.models.loader import load_model

    ids = list(range(3, 40))
    for precision in ("gguf", "gguf-q16", "gguf-q8"):
        model = load_model(str(tiny_q), precision).model
        calls = []
        monkeypatch.setattr(model, "kernels", _Spy(model.kernels, calls))
        stacked = _passes(model, ids)
        assert calls and all(n == "decode_stack_gguf" for n in calls), calls  # every pass in one call
        monkeypatch.setattr(model, "_native_stack", lambda: None)  # the loop over blocks in Python
        calls.clear()
        looped = _passes(model, ids)
        assert calls and "decode_stack_gguf" not in calls
        for a, b in zip(stacked, looped):
            assert torch.equal(a, b), precision
        assert looped[-1].abs().sum() > 0  # the features were written


def _passes(model, ids: list[int]) -> list[torch.Tensor]:
    """Logits of one-token, 6-row and whole-prompt passes, and a prefill's with a draft head's features (low,
    middle and the last block's output)."""
    logits = [logits_of(model, ids, chunk) for chunk in (1, 6, len(ids))]
    taps = (0, 1, model.cfg.num_layers)
    out = model.forward_tapped(torch.tensor([ids]), torch.tensor([0]), model.new_cache(1, 64), taps)
    tapped, feats = out.logits, out.features
    return logits + [tapped, feats]


class _Spy:
    """The kernels module, recording which of its block functions a pass calls."""

    def __init__(self, real, calls: list):
        self._real, self._calls = real, calls

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name in ("decode_stack_gguf", "decode_block_gguf"):
            def record(*a, **k):
                self._calls.append(name)
                return attr(*a, **k)
            return record
        return attr


def test_gguf_precision_needs_a_gguf_it_can_read(kernels, tiny_q, tmp_path, cache_here):
    from specdec.models.loader import load_model

    mixed = tmp_path / "mixed.gguf"
    write_tiny_gguf(mixed)  # Q and K in F32
    with pytest.raises(SpecdecError, match="F32"):
        load_model(str(mixed), "gguf")
    assert load_model(str(mixed)).model.precision == "fp16"  # the default falls back to a path that can run it
    folder = load_model(str(tiny_q), "fp32").path
    copy = tmp_path / "folder"
    copy.mkdir()
    for f in folder.iterdir():
        if f.name != "specdec_convert.json":  # a plain Hugging Face folder: no GGUF behind it
            (copy / f.name).symlink_to(f)
    with pytest.raises(SpecdecError, match="not from a GGUF"):
        load_model(str(copy), "gguf-q8")


def test_precision_on_the_command_line(kernels, tiny_q, cache_here, capsys):
    from specdec.cli import main

    assert main(["generate", "--model", str(tiny_q), "--precision", "gguf-q8", "--max-new-tokens", "4",
                 "--prompt", "abc", "--no-chat"]) in (0, None)
    assert main(["generate", "--model", str(tiny_q), "--precision", "q4", "--prompt", "abc"]) != 0
    assert "invalid choice: 'q4'" in capsys.readouterr().err
