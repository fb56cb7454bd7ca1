"""`specdec export-draft --format speculators`: the folder parses with the PyPI package speculators (the format
vLLM loads), and every tensor has the name, shape and dtype of the model speculators builds from that config;
d2t and t2d say the same vocabulary. A folder with a tensor missing or misshapen fails the same check."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specdec.cli import main
from specdec.heads.eagle import EagleHead, HeadConfig
from specdec.heads.export import export_speculators

CFG = HeadConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, eps=1e-5, rope_theta=10000.0,
                 max_positions=256, target_vocab=100, draft_vocab=24, taps=(1, 3, 5))


def speculators_check(folder) -> None:
    """Raise AssertionError unless speculators parses the config and its model's tensors are the folder's."""
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    cfg = SpeculatorModelConfig.from_pretrained(str(folder))
    assert isinstance(cfg, Eagle3SpeculatorConfig), type(cfg)
    raw = json.loads((folder / "config.json").read_text())
    for key in ("norm_before_residual", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids",
                "transformer_layer_config"):
        assert key in raw, key  # speculators would default these silently; vLLM reads them
    cfg.transformer_layer_config._attn_implementation = "eager"
    with torch.device("meta"):
        model = Eagle3DraftModel(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()
                if k not in Eagle3DraftModel._keys_to_ignore_on_save and k != "embed_tokens.weight"}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        actual = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {k: f.get_slice(k).get_dtype() for k in ("d2t", "t2d") if k in f.keys()}
    assert actual == expected, (sorted(set(actual) ^ set(expected)),
                                {k: (actual[k], expected[k]) for k in actual if k in expected
                                 and actual[k] != expected[k]})
    assert dtypes == {"d2t": "I64", "t2d": "BOOL"}, dtypes
    t = load_file(str(folder / "model.safetensors"))
    ids = torch.arange(len(t["d2t"])) + t["d2t"]  # target id of each draft id
    assert torch.equal(ids, t["t2d"].nonzero().flatten())


@pytest.fixture
def head_dir(tmp_path):
    torch.manual_seed(0)
    head = EagleHead(CFG)
    head.set_vocab(torch.randperm(100)[:24].sort().values)
    head.save(tmp_path / "head", meta={"verifier": "tiny-llama"})
    return tmp_path / "head"


def test_the_export_is_what_speculators_builds(head_dir, tmp_path):
    out = export_speculators(head_dir, tmp_path / "out")
    speculators_check(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5] and cfg["norm_before_residual"] is False
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny-llama"
    head, back = EagleHead.load(head_dir), load_file(str(out / "model.safetensors"))
    for k, v in head.tensors().items():
        assert torch.equal(back[k].to(v.dtype), v), k


@pytest.mark.parametrize("damage", ["drop-hidden-norm", "fc-two-layers", "d2t-absolute"])
def test_a_broken_export_fails_the_check(head_dir, tmp_path, damage):
    out = export_speculators(head_dir, tmp_path / "out")
    t = load_file(str(out / "model.safetensors"))
    if damage == "drop-hidden-norm":
        del t["layers.0.hidden_norm.weight"]
    elif damage == "fc-two-layers":
        t["fc.weight"] = t["fc.weight"][:, :128].contiguous()
    else:
        t["d2t"] = t["d2t"] + torch.arange(len(t["d2t"]))
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(AssertionError):
        speculators_check(out)


def test_export_cli(head_dir, tmp_path, capsys):
    assert main(["export-draft", str(head_dir), "--format", "speculators", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "config.json").exists()
    assert main(["export-draft", str(head_dir), "--out", str(tmp_path / "o")]) == 2  # not empty: refused
    assert "not empty" in capsys.readouterr().err
    assert main(["export-draft", str(tmp_path / "nothing"), "--out", str(tmp_path / "p")]) == 2
    assert "not a draft head" in capsys.readouterr().err


def test_the_bundled_head_exports(tmp_path, capsys):
    """`export-draft default`: the head shipped for the bundled model, as vLLM would load it for SmolLM2."""
    assert main(["export-draft", "default", "--format", "speculators", "--out", str(tmp_path / "o")]) == 0
    speculators_check(tmp_path / "o")
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert cfg["transformer_layer_config"]["vocab_size"] == 49152 and cfg["draft_vocab_size"] == 8192
