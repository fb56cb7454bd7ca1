"""Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) on the integer kernels (kernels/gguf_kq.inc), read as stored.

gguf-py's dequantize (bit-exact against libggml in its own tests) is the oracle for what the blocks mean:
gguf_blocks.decode must rebuild its values bit for bit, and the kernels must compute the integer paths' definition
on those weights (tests/test_gguf_kernels.py's int_reference). Rows never depend on the other rows, the two builds
give the same bits, and a fused matrix of mixed types (Q4_K_M's [q; k; v] with v in Q6_K) runs each part on its own
kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.models.gguf import blocks as gguf_blocks
from specdec.models.gguf.weights import QTensor, dequantize, qmatrix
from tests.test_gguf_kernels import (
    amx_gives_vnnis_bits,
    computes_the_definition,
    int_reference,
    split_equals_one_thread,
)

KQ = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
SCALE_AT = {"Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # fp16 fields of a block


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> QTensor:
    """Random bytes (every quant and integer scale value occurs) with fp16 scales of a realistic size."""
    size, per = gguf_blocks.LAYOUT[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    for at in SCALE_AT[kind]:
        scale = rng.uniform(-1, 1, (rows, cols // per)).astype(np.float16) * np.float16(0.01 if per == 32 else 0.001)
        b[..., at:at + 2] = scale.view(np.uint8).reshape(rows, cols // per, 2)
    return QTensor(kind, b.reshape(rows, -1), rows, cols)


@pytest.mark.parametrize("kind", KQ)
def test_decoding_rebuilds_gguf_pys_weights_bit_for_bit(kind):
    part = random_blocks(kind, 24, 512, seed=1)
    ours = gguf_blocks.dequantize(gguf_blocks.decode(kind, part.blocks, 24, 512))
    theirs = dequantize([part]).numpy()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_a_wrong_scale_unpacking_fails_the_oracle():
    """The check has teeth: Q4_K's upper four sub-blocks with their scale and minimum swapped differ from gguf-py."""
    part = random_blocks("Q4_K", 8, 256, seed=2)
    x = gguf_blocks.decode("Q4_K", part.blocks, 8, 256)
    x.sc[:, 4:], x.mn[:, 4:] = x.mn[:, 4:].copy(), x.sc[:, 4:].copy()
    assert not np.array_equal(gguf_blocks.dequantize(x), dequantize([part]).numpy())


@pytest.mark.parametrize("act_bits", [8, 16], ids=["q8", "q16"])
@pytest.mark.parametrize("kind", KQ)
def test_integer_paths_compute_their_definition(kernels, kind, act_bits, isa, paired):  # noqa: F811
    parts = [random_blocks(kind, 21, 512, seed=10)]  # 21 rows: 3 groups, a padded group and a padded pair
    qm = qmatrix(kernels, parts, True, act_bits, paired)
    computes_the_definition(kernels, qm, parts, act_bits, finer=30)


@pytest.mark.parametrize("kind", KQ)
def test_a_broken_high_bit_plane_fails_the_definition_check(kernels, kind):  # noqa: F811
    """The check above has teeth: the same blocks with the high bits (or, for Q4_K, the nibbles' halves) moved."""
    part = random_blocks(kind, 16, 256, seed=3)
    good = qmatrix(kernels, [part], True, 16)
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    ref = int_reference(x, [part], 16)
    assert np.abs(kernels.gemm_gguf(torch.from_numpy(x), good).double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
    from specdec.models.gguf.weights import kq_planes

    args = list(kq_planes([part], 16))
    if kind == "Q4_K":
        args[3] = (args[3] >> 4) | (args[3] << 4)  # the nibbles' halves swapped
    else:
        args[9] = torch.roll(args[9], 1, dims=-1)  # each high bit on the neighbouring byte
    broken = kernels.QMatrix(*args)
    got = kernels.gemm_gguf(torch.from_numpy(x), broken).double().numpy()
    assert np.abs(got - ref).max() > 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("act_bits", [8, 16], ids=["q8", "q16"])
@pytest.mark.parametrize("kind", KQ)
def test_rows_do_not_depend_on_the_other_rows(kernels, kind, act_bits, isa, paired):  # noqa: F811
    qm = qmatrix(kernels, [random_blocks(kind, 40, 256, seed=5)], True, act_bits, paired)
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([kernels.gemm_gguf(x[i:i + 1], qm) for i in range(40)])
    for m in (2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 40):
        assert torch.equal(kernels.gemm_gguf(x[:m], qm), alone[:m]), f"{m} rows"
    assert torch.equal(kernels.gemm_gguf(x.flip(0), qm).flip(0), alone)


@pytest.mark.parametrize("kind", KQ)
def test_the_vnni_build_gives_the_avx2_builds_bits(kernels, kind, paired):  # noqa: F811
    """Both builds, and both layouts (the VNNI build takes stored pairs two groups at a time in 512-bit registers),
    give the same bits."""
    if not kernels.cpu_has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: only the AVX2 build runs here")
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(7)) * 3
    for act_bits in (8, 16):
        qm = qmatrix(kernels, [random_blocks(kind, 37, 512, seed=20)], True, act_bits, paired)
        other = qmatrix(kernels, [random_blocks(kind, 37, 512, seed=20)], True, act_bits, not paired)
        before = kernels.set_isa("avx2")
        try:
            want = [kernels.gemm_gguf(x[:m], qm) for m in range(1, 20)]
            kernels.set_isa("vnni")
            got = [kernels.gemm_gguf(x[:m], qm) for m in range(1, 20)]
        finally:
            kernels.set_isa(before)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), act_bits
        assert all(torch.equal(kernels.gemm_gguf(x[:m], other), w) for m, w in zip(range(1, 20), want)), act_bits


@pytest.mark.parametrize("kind", KQ)
def test_the_amx_tiles_give_the_vnni_builds_bits(kernels, kind):  # noqa: F811
    """On AMX's tiles (q16 passes of 16 rows or more, whole tiles of 8 rows, weights in pairs; Q6_K and the rows past
    the last whole tile stay on the VNNI build) the blocks' integer sums are the VNNI build's and each lane scales
    them in its order, so the products are its bits: at every number of rows (every remainder after the tiles), for
    two pairs at a time, a last pair, a last group alone and a pair whose second group is padding, on one thread and
    split between two."""
    if not kernels.cpu_has_amx():
        pytest.skip("this CPU has no AMX-INT8 (or the kernel does not grant it)")
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(12)) * 3
    x[3, :32] = 0.0  # an all-zero block
    for n in (48, 37, 13, 200):  # 3 pairs; 2 pairs + a group alone; 13 live rows in a pair; split between threads
        qm = qmatrix(kernels, [random_blocks(kind, n, 512, seed=40)], True, 16, True)
        amx_gives_vnnis_bits(kernels, qm, x, list(range(1, 25)) + [40], f"{kind} {n}")


def test_a_split_product_is_the_whole_product(kernels):  # noqa: F811
    """400 weight rows are split between threads; each part equals the same rows on one thread."""
    qm = qmatrix(kernels, [random_blocks("Q6_K", 400, 256, seed=8)], True, 16, paired=True)
    x = torch.randn(17, 256, generator=torch.Generator().manual_seed(9))
    split_equals_one_thread(kernels, qm, x)


def test_a_fused_matrix_of_mixed_types_runs_each_part_on_its_own_kernel(kernels):  # noqa: F811
    """Q4_K_M's [q; k; v]: q and k in Q4_K, v in Q6_K; and a legacy Q8_0 part beside a K-quant."""
    parts = [random_blocks("Q4_K", 32, 256, 30), random_blocks("Q4_K", 16, 256, 31), random_blocks("Q6_K", 16, 256, 32)]
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(3))
    fused = qmatrix(kernels, parts, True, 16, paired=True)
    assert fused.stacked == 2 and fused.N == 64  # the two Q4_K parts together, the Q6_K part on its own
    alone = torch.cat([kernels.gemm_gguf(x, qmatrix(kernels, [p], True, 16)) for p in parts], dim=1)
    assert torch.equal(kernels.gemm_gguf(x, fused), alone)
    ref = int_reference(x.numpy(), parts, 16)
    assert np.abs(kernels.gemm_gguf(x, fused).double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


def test_the_exact_path_names_what_it_reads(kernels):  # noqa: F811
    with pytest.raises(SpecdecError, match="gguf-q16"):
        qmatrix(kernels, [random_blocks("Q4_K", 8, 256, 1)], False)


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    """Tiny llama and qwen2 files in llama.cpp's Q4_K_M mix (Q4_K, Q6_K for some attn_v / ffn_down, the tied
    embedding in Q6_K), and one in Q5_0: random weights, real block types."""
    from specdec.models.gguf.synth import write

    folder = tmp_path_factory.mktemp("synth")
    out = {}
    for shape, quant in (("tiny-llama", "Q4_K_M"), ("tiny-qwen2", "Q4_K_M"), ("tiny-llama", "Q5_0")):
        out[shape, quant] = folder / f"{shape}-{quant}.gguf"
        write(out[shape, quant], shape, quant, seed=3)
    return out


@pytest.mark.parametrize("case", [("tiny-llama", "Q4_K_M"), ("tiny-qwen2", "Q4_K_M"), ("tiny-llama", "Q5_0")],
                         ids="-".join)
def test_a_k_quant_file_runs_lean_on_its_own_blocks(kernels, synth_files, case, tmp_path, monkeypatch):  # noqa: F811
    """The default load of a K-quant llama or qwen2 file is an integer path (the faster here, measured at its first
    load) from a lean folder (no dequantized matrices); gguf-q16 is close to the fp32 model on the same weights, and a
    verify pass or prefill gives the one-token passes' bits."""
    from specdec.models.gguf.convert import is_lean
    from specdec.models.loader import load_model
    from tests.test_gguf_kernels import logits_of

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = synth_files[case]
    loaded = load_model(str(path))
    assert loaded.model.precision in ("gguf-q16", "gguf-q8") and is_lean(loaded.path)
    assert (loaded.path / "model.safetensors").stat().st_size < 64 << 10  # vectors only
    loaded = load_model(str(path), "gguf-q16")
    model = loaded.model
    assert is_lean(loaded.path)
    ids = list(range(3, 40))
    one = logits_of(model, ids, 1)
    assert torch.equal(logits_of(model, ids, 6), one)
    assert torch.equal(logits_of(model, ids, len(ids)), one)
    want = logits_of(load_model(str(path), "fp32").model, ids, len(ids))
    err = float((one - want).abs().max() / want.abs().max())
    assert err < 2e-3, f"{err:.2e} from the fp32 model"


def test_llama3_rope_scaling_is_transformers(tmp_path):
    """Llama 3's rope scaling (config rope_scaling llama3, or a GGUF's rope_freqs) divides each frequency as
    transformers' llama3 rope does."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specdec.models.config import llama3_factors

    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    cfg = LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_theta=500000.0, rope_scaling=rope,
                      max_position_embeddings=131072)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    base = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    ours = base / torch.tensor(llama3_factors(500000.0, 64, rope), dtype=torch.float32)
    assert torch.allclose(ours, inv.float(), rtol=1e-5, atol=0)
    assert not torch.allclose(base, inv.float(), rtol=1e-3)


@pytest.mark.parametrize("paired", [False, True], ids=["groups", "pairs"])
@pytest.mark.parametrize("kind", KQ)
def test_the_native_packer_writes_the_numpy_definitions_planes(kernels, kind, paired):  # noqa: F811
    """kernels.kq_pack (one pass over the file's bytes, for loading) writes exactly kq_planes' numpy planes, with
    rows that fill no whole group or pair (21: 3 groups)."""
    from specdec.models.gguf.weights import kq_planes

    parts = [random_blocks(kind, 13, 512, seed=40), random_blocks(kind, 8, 512, seed=41)]
    want = kq_planes(parts, 16, paired)
    got = kq_planes(parts, 16, paired, kernels)
    assert want[:3] == got[:3] and want[6:9] == got[6:9] and want[11] == got[11]
    for i in (3, 4, 5, 9, 10):
        assert (want[i] is None) == (got[i] is None), i
        if want[i] is not None:
            assert torch.equal(want[i].reshape(-1).view(torch.uint8), got[i].reshape(-1).view(torch.uint8)), i


def test_a_file_the_kernels_cannot_read_says_what_its_fallback_costs(kernels, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Never a silent fp16 fallback: an F16 GGUF runs dequantized, and says which types, what the kernels read and
    the bytes a token it costs."""
    from specdec.models.gguf.synth import write
    from specdec.models.loader import load_model

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny-f16.gguf"
    write(path, "tiny-llama", "F16", seed=1)
    assert load_model(str(path)).model.precision == "fp16"
    err = capsys.readouterr().err
    assert "holds F16 matrices" in err and "Q4_K" in err and "GB of weights a token" in err
