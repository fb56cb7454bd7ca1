"""The architectures added beside llama/qwen2/gemma3, on random-weight GGUFs of their layout (synth_gguf's tiny
shapes, Q4_K_M mix): each loads on its GGUF's own blocks in one native call a pass; the native path agrees with the
fp32 torch path on the same weights (and that path with transformers' own model where transformers reads the
converted folder); a verify pass equals one-token passes bit for bit; speculative greedy output is plain greedy
output. tests/test_llamacpp_matrix.py holds the native path to llama.cpp's logits on the same files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.models.gguf.synth import SHAPES as SYNTH
from specdec.models.gguf.synth import write
from specdec.models.loader import load_model
from tests.conftest import divergence_message, greedy_reference
from tests.test_engine_model import mismatch_report, ours_prefill_then_decode, verify_vs_one_token

SHAPES = ["tiny-qwen3", "tiny-gemma2", "tiny-phi3", "tiny-phi3-longrope", "tiny-qwen3moe", "tiny-mixtral"]
VOCAB = 49152  # the tiny shapes' (the bundled tokenizer's)


# Phi-3 with a window of 8 positions (its real one, 2047, is longer than these tests' sequences)
NARROW_PHI3 = replace(SYNTH["tiny-phi3"], sliding_window=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """shape -> its Q4_K_M GGUF, written once; models convert into a cache of the module's own."""
    folder = tmp_path_factory.mktemp("archs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(folder / "cache"))
        made = {s: write(folder / f"{s}.gguf", s, "Q4_K_M").path for s in SHAPES}
        made["narrow-phi3"] = write(folder / "narrow-phi3.gguf", NARROW_PHI3, "Q4_K_M").path
        yield made


_models: dict = {}


def model(files, shape: str, precision: str):
    if (shape, precision) not in _models:
        _models[shape, precision] = load_model(str(files[shape]), precision).model
    return _models[shape, precision]


@pytest.mark.parametrize("shape", SHAPES)
def test_runs_on_its_native_blocks(files, kernels, shape):  # noqa: F811
    m = model(files, shape, "gguf-q16")
    assert m.precision == "gguf-q16" and m.kernels is not None and m._native_stack() is not None
    assert m.exact_kv_reuse
    assert model(files, shape, "fp32").kernels is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["gguf-q16", "gguf-q8"])
def test_native_logits_close_to_fp32(files, kernels, shape, precision):  # noqa: F811
    """Prefill and decode passes on the file's blocks against the torch path on the same weights dequantized:
    gguf-q16's 15-bit activations are nearly exact; gguf-q8's 8-bit ones move the logits more (as llama.cpp's do),
    and in a mixture of experts a moved router logit can send a row to another expert: its mean, not its max."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (20, 9)]
    tails = [torch.randint(0, VOCAB, (7,), generator=g).tolist() for _ in prompts]
    got = ours_prefill_then_decode(model(files, shape, precision), prompts, tails)
    ref = ours_prefill_then_decode(model(files, shape, "fp32"), prompts, tails)
    error = max((a - b).abs().max().item() for a, b in zip(got, ref))
    mean = max((a - b).abs().mean().item() for a, b in zip(got, ref))
    scale = max(b.abs().max().item() for b in ref)
    agreement = min((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in zip(got, ref))
    print(f"{shape} {precision}: |logit error| max {error:.3g} mean {mean:.3g} (logits up to {scale:.3g}), "
          f"argmax {agreement:.3f}")
    if precision == "gguf-q16":
        assert error < 2e-3 * scale and agreement >= 0.9
    else:
        assert mean < 2e-2 * scale and agreement >= 0.7


@pytest.mark.parametrize("shape", SHAPES + ["narrow-phi3"])
def test_torch_path_agrees_with_transformers(files, shape):
    """The converted folder loads in transformers as the architecture it names; its logits are specdec's fp32
    torch path's to float rounding (narrow-phi3: past its window of 8, which transformers applies too)."""
    from transformers import AutoModelForCausalLM

    ours = model(files, shape, "fp32")
    folder = Path(load_model(str(files[shape]), "fp32").path)
    if ours.cfg.moe:  # transformers 5 keeps [gate; up] of every expert in one parameter
        theirs = hf_moe(folder)
    else:
        theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = theirs(ids).logits[0]  # [24, vocab]
    got = ours_prefill_then_decode(ours, [ids[0, :17].tolist()], [ids[0, 17:].tolist()])[0]
    assert (got - ref).abs().max() < 1e-3 * ref.abs().max(), (got - ref).abs().max()


def hf_moe(folder: Path):
    """transformers' model of a converted mixture-of-experts folder: its config, and our per-projection expert
    tensors [E, F, H] fused as transformers 5 holds them (experts.gate_up_proj [E, 2F, H], experts.down_proj)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.models.checkpoint import load_weights

    theirs = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).eval()
    state = {}
    for name, t in load_weights(folder).items():
        if name.endswith("experts.gate_proj.weight"):
            up = load_weights(folder)[name.replace("gate_proj", "up_proj")]
            state[name.replace("gate_proj.weight", "gate_up_proj")] = torch.cat([t, up], dim=1)
        elif name.endswith("experts.down_proj.weight"):
            state[name.removesuffix(".weight")] = t
        elif not name.endswith("experts.up_proj.weight"):
            state[name] = t
    theirs.load_state_dict(state, strict=True)
    return theirs


def test_experts_are_read_once_a_pass(files, kernels):  # noqa: F811
    """A pass reads each expert its rows use once: one row touches k experts a layer, and 9 rows at most all E,
    at least k; the counts come from the native layer itself."""
    m = model(files, "tiny-qwen3moe", "gguf-q16")
    layers = [blk.experts for blk in m.blocks]
    cache = m.new_cache(1, 64)

    def touched(n):
        for layer in layers:
            layer.touched = layer.calls = 0
        ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
        m.forward(ids, torch.tensor([0]), cache)
        assert all(layer.calls == 1 for layer in layers)
        return [layer.touched for layer in layers]

    k, e = m.cfg.experts_per_token, m.cfg.num_experts
    assert touched(1) == [k] * len(layers)
    many = touched(9)
    assert all(k < t <= e for t in many), many


def test_phi3_window_on_the_native_blocks(files, kernels):  # noqa: F811
    """The window reaches the native attention: gguf-q16 follows the fp32 path past it, and differs from the
    same weights read without a window."""
    g = torch.Generator().manual_seed(4)
    prompts, tails = [torch.randint(0, VOCAB, (20,), generator=g).tolist()], [[5, 6, 7, 8]]
    got = ours_prefill_then_decode(model(files, "narrow-phi3", "gguf-q16"), prompts, tails)[0]
    ref = ours_prefill_then_decode(model(files, "narrow-phi3", "fp32"), prompts, tails)[0]
    wide = ours_prefill_then_decode(model(files, "tiny-phi3", "fp32"), prompts, tails)[0]
    scale = ref.abs().max()
    assert (got - ref).abs().max() < 2e-3 * scale and (wide - ref)[10:].abs().max() > 0.05 * scale


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["gguf-q16", "gguf-q8", "fp16"])  # fp32 is exact, not batch-invariant
def test_verify_pass_equals_one_token_passes_bit_for_bit(files, kernels, shape, precision):  # noqa: F811
    m = model(files, shape, precision)
    g = torch.Generator().manual_seed(2)
    for k in (1, 4, 9):
        prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (60, 5, 18)]
        drafts = [torch.randint(0, VOCAB, (k,), generator=g).tolist() for _ in prompts]
        verify, single = verify_vs_one_token(m, prompts, drafts)
        assert torch.equal(verify, single), f"k = {k}: " + mismatch_report(verify, single)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", [2, 5])
def test_speculative_greedy_equals_plain_greedy(files, kernels, shape, k):  # noqa: F811
    m = model(files, shape, "gguf-q16")
    drafted = accepted = 0
    for prompt in ([1, 10, 11, 12, 13, 10, 11, 12, 13, 10], [1, 20, 21, 22, 20, 21], [1], [1] + [5, 6] * 12):
        expected = greedy_reference(m, prompt, 40)
        res = Engine(m, None).generate([prompt], GenerationConfig(40), NgramDrafter(4, 1), k)[0]
        assert res.token_ids == expected, divergence_message(m, prompt, expected, res.token_ids)
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    assert 0 < accepted <= drafted, (accepted, drafted)


def test_longrope_runs_short_factors_within_its_original_context_and_long_ones_past_it(files, capsys):
    """A LongRoPE file (Phi-3 128k, Phi-3.5) runs on its short factors and attention factor within its original
    context (transformers and llama.cpp agree there: test_torch_path_agrees_with_transformers, the llama.cpp
    matrix), said at load, and a longer prompt is refused in one line. Loaded for a longer context, every position
    runs the long factors (llama.cpp's rule: the matrix's test_longrope_long_factors_match_llamacpp), and a prompt
    past the original context runs; a context past the trained one is capped to it, as a server's is."""
    from specdec.errors import SpecdecError
    from specdec.models.gguf.synth import longrope_attn_factor, longrope_factors

    shape = SYNTH["tiny-phi3-longrope"]
    loaded = load_model(str(files["tiny-phi3-longrope"]), "gguf-q16")
    cfg = loaded.model.cfg
    assert (cfg.max_position_embeddings, cfg.long_context) == (shape.longrope, shape.context)
    assert cfg.rope_freq_factors == pytest.approx(longrope_factors(shape, long=False).tolist())
    assert cfg.rope_attn_factor == pytest.approx(longrope_attn_factor(shape)) and cfg.rope_attn_factor > 1.05
    assert "its short factors" in capsys.readouterr().err
    with pytest.raises(SpecdecError, match="4096"):
        Engine(loaded.model, loaded.tokenizer).generate([[5] * (shape.longrope + 1)],
                                                        GenerationConfig(max_new_tokens=1))
    longer = load_model(str(files["tiny-phi3-longrope"]), "gguf-q16", context=2 * shape.longrope)
    cfg = longer.model.cfg
    assert cfg.max_position_embeddings == 2 * shape.longrope and cfg.long_factors
    assert cfg.rope_freq_factors == pytest.approx(longrope_factors(shape, long=True).tolist())
    assert "its long factors at every position" in capsys.readouterr().err
    r = Engine(longer.model, longer.tokenizer).generate([[5] * (shape.longrope + 1)], GenerationConfig(2))[0]
    assert len(r.token_ids) == 2
    capped = load_model(str(files["tiny-phi3-longrope"]), "gguf-q16", context=shape.context + 1).model.cfg
    assert capped.max_position_embeddings == shape.context and capped.long_factors  # all it was trained to


def test_what_is_not_covered_is_refused_in_one_line(tmp_path):
    """A LongRoPE file without its original context, and partial rotary embeddings (Phi-4-mini), are refused by
    name; so is an architecture specdec does not run, with the list of those it does."""
    from specdec.errors import SpecdecError
    from specdec.models.config import ModelConfig
    from specdec.models.gguf.arch import ARCHS, arch_of
    from specdec.models.gguf.llama import longrope

    with pytest.raises(SpecdecError, match="LongRoPE needs.*original_context_length"):
        longrope({}, tmp_path / "phi.gguf", {"rope_factors_short": [1.0], "rope_factors_long": [1.0]}, 2, 1e4)
    base = {"model_type": "phi3", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2}
    with pytest.raises(SpecdecError, match="partial rotary"):
        ModelConfig.from_hf({**base, "partial_rotary_factor": 0.75})
    with pytest.raises(SpecdecError, match="sliding_window must be an integer"):
        ModelConfig.from_hf({**base, "sliding_window": "wide"})
    assert ModelConfig.from_hf({**base, "sliding_window": 2047}).sliding_window == 2047
    moe = {**base, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}
    assert ModelConfig.from_hf(moe).moe
    for change, fragment in (({"num_experts_per_tok": 5}, "more than the 4 experts"),
                             ({"mlp_only_layers": [0]}, "dense layers among the sparse ones"),
                             ({"moe_intermediate_size": 0}, "moe_intermediate_size must be an integer")):
        with pytest.raises(SpecdecError, match=fragment):
            ModelConfig.from_hf({**moe, **change})
    with pytest.raises(SpecdecError) as e:
        arch_of({"general.architecture": "falcon"}, tmp_path / "f.gguf")
    assert "'falcon' is not supported" in str(e.value) and all(a in str(e.value) for a in ARCHS)
