"""`--kv-cache f16|q8_0|q4_0` around the model (issue 59): the name checked in one line before anything loads, on
every command that builds a target and in Python; refused in one line where the model cannot run the type (the
torch path, the transformers adapter); set at load with a line saying what it keeps; named by /health and serve's
start line with its bytes a position; and part of the keys of what is kept per model (the pass costs, the prefix
cache's entries), so that a q8_0 cache never reads what an f16 one left.

The kernels' q8_0 and q4_0 attention is tested in test_kv_kernels.py. Here, where a test needs a model on q8_0
without a pass, the kernels' kv_types is stood in for (`quantized_types`), so that these tests run on a CPU whose
kernels could not; the one test that decodes on a quantized type runs where the kernels list it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.errors import SpecdecError
from tests.conftest import one_error_line, write_tiny_model, write_word_tokenizer

WORDS = ["<unk>", "<eos>", *[f"w{i}" for i in range(30)]]
TYPES = ("f16", "q8_0", "q4_0")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A loadable tiny model with head_dim 64 (2 KV heads, 2 layers: 1,024 bytes a position in f16), as the
    quantized blocks of 32 values need, and a word-level tokenizer."""
    path = tmp_path_factory.mktemp("tiny-kv")
    write_tiny_model(path, vocab=len(WORDS), max_pos=128, hidden=128, heads=2)
    write_word_tokenizer(path, WORDS)
    return path


@pytest.fixture
def quantized_types(kernels, monkeypatch):
    """The kernels as they will be: listing every type (kv_types), so that use_kv_cache accepts q8_0 and q4_0.
    Nothing may run a pass on them here."""
    real = getattr(kernels, "kv_types", None)
    if real is None or not set(TYPES) <= set(real()):
        monkeypatch.setattr(kernels, "kv_types", lambda: TYPES, raising=False)
    return kernels


# ---- the name --------------------------------------------------------------------------------------------------

def test_the_types_are_llama_cpps_names_with_their_block_sizes():
    from specdec.models.kv_cache import DEFAULT_KV, KV_TYPES

    assert tuple(KV_TYPES) == TYPES and DEFAULT_KV == "f16"
    # bytes of 32 values: llama.cpp's block_q8_0 (32 int8 + an fp16 scale) and block_q4_0 (16 bytes + the scale)
    assert [KV_TYPES[t].bytes_per_value(64) * 32 for t in TYPES] == [64, 34, 18]


@pytest.mark.parametrize("name", ["q5_1", "Q8_0", "fp8", ""])
def test_model_spec_refuses_an_unknown_type_in_one_line(name):
    from specdec.runtime import ModelSpec

    with pytest.raises(SpecdecError) as e:
        ModelSpec(kv_cache=name)
    assert "\n" not in str(e.value) and repr(name) in str(e.value) and "q8_0" in str(e.value)
    for good in (None, *TYPES):
        assert ModelSpec(kv_cache=good).kv_cache == good


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "hi"], ["demo"], ["serve"], ["bench", "--prompts", "q.jsonl"], ["profile"], ["expect"],
    ["bench", "long-context", "--prompts", "q.jsonl"],
], ids=lambda a: " ".join(a[:2]))
def test_every_command_that_builds_a_target_takes_the_flag_and_refuses_an_unknown_type(capsys, argv):
    assert main([*argv, "--kv-cache", "q5_1"]) == 2
    line = one_error_line(2, capsys.readouterr().err, "--kv-cache", "invalid choice: 'q5_1'")
    assert all(t in line for t in TYPES)


def test_the_python_api_refuses_an_unknown_type_before_loading(monkeypatch):
    import specdec
    import specdec.models.loader as loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SpecdecError, match="unknown KV cache type 'q2'"):
        specdec.load(kv_cache="q2")
    with pytest.raises(SpecdecError, match="unknown KV cache type 'q2'"):
        specdec.generate("hi", kv_cache="q2")


def test_the_target_gets_the_type_and_a_draft_model_keeps_f16(monkeypatch):
    """ModelSpec.from_args reads --kv-cache; build hands it to load_model for the target only."""
    import specdec.models.loader as loader
    from specdec.engine.cli import add_model_args
    from specdec.runtime import ModelSpec, build

    calls = []

    class Stop(Exception):
        pass

    def load(spec, *args, **kwargs):
        calls.append((spec, args, kwargs))
        if len(calls) == 2:
            raise Stop
        return "target"

    import argparse

    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args(["--kv-cache", "q4_0", "--drafter", "draft-model", "--draft-model", "small"])
    spec = ModelSpec.from_args(args)
    assert spec.kv_cache == "q4_0"
    monkeypatch.setattr(loader, "load_model", load)
    with pytest.raises(Stop):
        build(spec)
    (target, t_args, t_kw), (draft, d_args, d_kw) = calls
    assert target == "default" and "q4_0" in t_args + tuple(t_kw.values())
    assert draft == "small" and "q4_0" not in d_args + tuple(d_kw.values())
    assert p.parse_args([]).kv_cache is None and ModelSpec.from_args(p.parse_args([])).kv_cache is None


# ---- what cannot run it ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_the_torch_path_refuses_a_quantized_type_in_one_line(capsys, folder, kv):
    code = main(["generate", "--model", str(folder), "--precision", "fp32", "--kv-cache", kv, "--prompt", "w1",
                 "--no-chat"])
    one_error_line(code, capsys.readouterr().err, f"--kv-cache {kv}", "native kernels", "fp32")


@pytest.mark.parametrize("precision, kernels_built", [("fp32", True), ("fp16", False)])
def test_a_path_that_cannot_keep_the_type_is_refused_before_any_weights_load(capsys, folder, monkeypatch,
                                                                              quantized_types, precision,
                                                                              kernels_built):
    """Decided from the config, the precision and whether the kernels could be built: nothing is loaded (or a GGUF
    converted) to be thrown away."""
    from specdec.models import loader

    def no_build(*a, **k):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(loader, "_build", no_build)
    if not kernels_built:
        monkeypatch.setattr("specdec.kernels.decode_kernels", lambda: None)
    with pytest.raises(SpecdecError) as e:
        loader.load_model(str(folder), precision, kv_cache="q4_0")
    assert "--kv-cache q4_0 needs the native kernels" in str(e.value) and f"torch path ({precision}" in str(e.value)


@pytest.mark.parametrize("hidden, head", [(1024, 512), (96, 48)])
def test_heads_the_quantized_blocks_cannot_hold_are_refused_in_one_line(capsys, tmp_path, quantized_types, hidden,
                                                                       head):
    """The quantized kernels round each 32 values of a head and hold heads of up to 256 (their value weights'
    blocks); a head of 512 or of 48 is refused at load, f16 still runs it."""
    write_tiny_model(tmp_path, vocab=len(WORDS), max_pos=64, hidden=hidden, heads=2)
    write_word_tokenizer(tmp_path, WORDS)
    capsys.readouterr()  # the writer's progress
    code = main(["generate", "--model", str(tmp_path), "--precision", "fp16", "--kv-cache", "q8_0", "--prompt", "w1",
                 "--no-chat", "--max-new-tokens", "2"])
    one_error_line(code, capsys.readouterr().err, "--kv-cache q8_0", f"heads hold {head}", "use f16")


def test_the_transformers_adapter_refuses_a_quantized_type_and_takes_f16(capsys, folder, monkeypatch):
    import specdec.models.loader as loader

    monkeypatch.setattr(loader, "SUPPORTED_TYPES", ())  # the tiny llama, as a model specdec does not run itself
    code = main(["generate", "--model", str(folder), "--kv-cache", "q8_0", "--prompt", "w1", "--no-chat"])
    one_error_line(code, capsys.readouterr().err, "--kv-cache q8_0", "transformers", "f16")
    loaded = loader.load_model(str(folder), kv_cache="f16")
    assert loaded.backend == "transformers"
    from specdec.models.target import TargetTraits

    assert TargetTraits.of(loaded.model).kv_cache == "f16"


def test_with_kv_cache_is_the_one_place_a_type_is_set():
    from specdec.models.loader import with_kv_cache

    class Own:
        def __init__(self):
            self.kv = None

        def use_kv_cache(self, name):
            self.kv = name

    bare = object()
    assert with_kv_cache(bare, "f16", "m") is bare
    with pytest.raises(SpecdecError, match="transformers"):
        with_kv_cache(bare, "q4_0", "m")
    assert with_kv_cache(Own(), "q8_0", "m").kv == "q8_0"


# ---- set at load, said at load ---------------------------------------------------------------------------------

def test_a_quantized_type_is_set_at_load_and_said_in_one_line(capsys, folder, quantized_types):
    from specdec.models.kv_cache import KV_TYPES
    from specdec.models.loader import load_model

    capsys.readouterr()
    f16 = load_model(str(folder), "fp16")
    assert f16.model.kv_cache == "f16" and "KV cache" not in capsys.readouterr().err  # the default: nothing said
    q8 = load_model(str(folder), "fp16", kv_cache="q8_0")
    err = capsys.readouterr().err
    assert q8.model.kv_cache == "q8_0" and q8.model.kv_bytes_per_token() == KV_TYPES["q8_0"].bytes_per_position(
        q8.model.cfg) == 544
    assert err.count("\n") == 1 and "KV cache q8_0 (1.06 bytes a value, 53% of f16: 544 bytes a position)" in err
    assert "llama.cpp's q8_0" in err and "exact" in err
    assert q8.model.new_cache(1, 64).kind.name == "q8_0"  # caches made from then on


# ---- serve -----------------------------------------------------------------------------------------------------

def _serve(capsys, monkeypatch, folder, *extra: str):
    from specdec.serve import cli
    from tests.serving import free_port

    apps = []
    monkeypatch.setattr(cli, "serve_on_this_thread", lambda worker, server: apps.append(server.config.app) or 0)
    capsys.readouterr()
    code = main(["serve", "--model", str(folder), "--precision", "fp16", "--drafter", "none", "--port",
                 str(free_port()), "--max-batch", "2", *extra])
    return code, capsys.readouterr().err, apps


@pytest.mark.parametrize("kv, per", [("f16", 1024), ("q8_0", 544), ("q4_0", 288)])
def test_serve_names_the_type_its_bytes_a_position_and_the_context_that_fits(capsys, monkeypatch, folder, kernels,
                                                                              quantized_types, kv, per):
    """The start line: the type, its bytes a position (2 layers x 2 KV heads x 64 values, keys and values), and
    the longest context at which both slots and the prefix entries fit the memory available; /health names the
    type. Nothing runs a pass: --drafter none, and no request."""
    from fastapi.testclient import TestClient

    import specdec.models.loader as loader

    monkeypatch.setattr(loader, "available_bytes", lambda: 6 * per * 100)  # 6 rows (2 slots + 4 entries) x 100
    code, err, apps = _serve(capsys, monkeypatch, folder, "--kv-cache", kv)
    assert code == 0, err
    start = next(line for line in err.splitlines() if line.startswith("specdec: serving "))
    assert f"KV cache {kv}, {per:,} bytes a position" in start, start
    assert "holds every slot and prefix entry full at up to 100 positions" in start, start
    warning = next(line for line in err.splitlines() if line.startswith("specdec: warning: the KV pool"))
    assert f"(KV cache {kv}, {per:,} bytes a position)" in warning  # 6 x 128 positions reserved: more than that
    health = TestClient(apps[-1]).get("/health").json()
    assert health["kv_cache"] == kv and health["status"] == "ok"


def test_serve_refuses_a_context_one_sequence_could_not_fill_naming_the_type(capsys, monkeypatch, folder, kernels):
    import specdec.models.loader as loader
    from specdec.engine import scheduler

    monkeypatch.setattr(loader, "available_bytes", lambda: 100 * 1024)  # 100 f16 positions of this model
    monkeypatch.setattr(scheduler.Scheduler, "__init__", lambda *a, **k: pytest.fail("the pool was made"))
    code, err, apps = _serve(capsys, monkeypatch, folder, "--context", "128")
    one_error_line(code, err, "--context 128 does not fit", "KV cache f16, 1,024 bytes a position",
                   "enough for 100 positions", "--kv-cache q8_0 or q4_0")
    assert apps == []


def test_pool_arithmetic():
    from specdec.serve.cli import check_context_fits, longest_context

    assert longest_context(1000, 4, 10**6) == 250 and longest_context(None, 4, 10**6) is None
    assert longest_context(1000, 4, None) is None
    check_context_fits(1000, "q4_0", 1000, 10**6)  # exactly fits: nothing said
    check_context_fits(10**9, "f16", 1000, None)  # memory unknown: nothing refused
    with pytest.raises(SpecdecError) as e:
        check_context_fits(1001, "q4_0", 1000, 10**6)
    assert "KV cache q4_0, 1,000 bytes a position" in str(e.value) and "--kv-cache" not in str(e.value)
    with pytest.raises(SpecdecError) as e:
        check_context_fits(1001, "f16", 1000, 10**6, native=False)  # the torch path: no smaller type to offer
    assert "--kv-cache" not in str(e.value) and "enough for 1,000 positions" in str(e.value)


def test_the_pool_warning_names_the_type_and_a_smaller_one(capsys):
    from specdec.serve.cli import warn_reserved

    assert warn_reserved(6.7, available=4.0, kv="f16", per_position=23040)
    err = capsys.readouterr().err
    assert "KV cache f16, 23,040 bytes a position" in err and "--kv-cache q8_0 or q4_0" in err
    assert warn_reserved(6.7, available=4.0, kv="q4_0", per_position=6480)
    assert "--kv-cache" not in capsys.readouterr().err.replace("KV cache", "")  # nothing smaller to offer


# ---- keys ------------------------------------------------------------------------------------------------------

def test_the_prefix_cache_keeps_entries_per_type(folder, kernels, quantized_types, monkeypatch):
    """Entries made on q8_0 are found by a q8_0 cache only; an f16 cache neither finds them nor leaves any."""
    import torch

    from specdec.engine.prefix import PrefixCache
    from specdec.models.kv_cache import KVCache
    from specdec.models.loader import load_model

    model = load_model(str(folder), "fp16", kv_cache="q8_0").model
    store = PrefixCache(model, 2, 128)
    q8 = model.new_cache(1, 128, huge_pages=False)
    f16 = KVCache(model.cfg, 1, 128, model.device, torch.float16, blocked=True, huge_pages=False)
    assert store.kind.name == q8.kind.name == "q8_0" and f16.kind.name == "f16"
    doc = list(range(2, 60))
    store.store(doc, q8, 0)
    assert store.load(doc + [7], q8, 0) == len(doc)
    assert store.load(doc + [7], f16, 0) == 0  # another type: a miss, never a copy between types
    store.store(list(range(3, 40)), f16, 0)  # another type: nothing kept
    assert [len(e.tokens) for e in store.entries if e is not None] == [len(doc)]
    assert (store.lookups, store.hits) == (2, 1)


def test_pass_costs_are_keyed_by_type_and_f16_keeps_its_old_key(folder, kernels, quantized_types, tmp_path,
                                                                monkeypatch):
    from specdec.engine import costs
    from specdec.models.loader import load_model

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    keys = {kv: costs.key(load_model(str(folder), "fp16", kv_cache=kv)) for kv in TYPES}
    assert len(set(keys.values())) == 3
    assert "|kv" not in keys["f16"] and "|fp16|" in keys["f16"]  # the key entries cached before types had
    assert keys["q8_0"] == keys["f16"].replace("|fp16|", "|fp16|kv q8_0|")
    f16 = load_model(str(folder), "fp16")
    entry = {"verify_cost": {"1": 1.0, "2": 1.1}, "step_s": 0.001, "rows": 4096}
    assert costs.store().put(costs.key(f16), entry)
    assert costs.cached(f16) is not None
    assert costs.cached(load_model(str(folder), "fp16", kv_cache="q8_0")) is None  # never f16's curve


def test_a_profile_or_bench_report_names_a_type_other_than_f16():
    from specdec.bench.render import kv_note

    assert kv_note({"kv_cache": "q8_0"}) == ", KV cache q8_0"
    assert kv_note({"kv_cache": "f16"}) == kv_note({}) == ""  # f16, or a profile from before there were types


# ---- bench long-context ----------------------------------------------------------------------------------------

def test_bench_long_context_takes_the_type_and_the_other_suites_refuse_it(capsys, monkeypatch):
    import specdec.bench.suites as suites

    ran = []
    monkeypatch.setattr(suites, "run_suite", lambda args: ran.append(vars(args).copy()) or 0)
    assert main(["bench", "long-context", "--prompts", "q", "--kv-cache", "q4_0"]) == 0
    assert main(["bench", "--kv-cache", "q8_0", "long-context", "--prompts", "q"]) == 0
    assert main(["bench", "long-context", "--prompts", "q"]) == 0
    assert [r["kv_cache"] for r in ran] == ["q4_0", "q8_0", None]
    capsys.readouterr()
    assert main(["bench", "--kv-cache", "q8_0", "kernels"]) == 2
    one_error_line(2, capsys.readouterr().err, "--kv-cache does not apply to `bench kernels`")


def test_a_long_context_run_records_its_type_and_old_runs_read_as_f16():
    from specdec.bench.hardware.long_context_report import LongContextRun

    recorded = sorted((Path(__file__).resolve().parent.parent / "docs" / "results").glob("long-context*.json"))
    if not recorded:
        pytest.skip("no recorded long-context run")
    data = json.loads(recorded[0].read_text())
    data.pop("kv_cache", None)
    assert LongContextRun.from_json(data).kv_cache == "f16"


# ---- on the kernels' q8_0 (runs once they list it) -------------------------------------------------------------

def _kernels_run(kv: str) -> bool:
    from specdec.kernels import decode_kernels

    k = decode_kernels()
    return k is not None and hasattr(k, "kv_types") and kv in k.kv_types()


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_speculation_on_a_quantized_cache_is_plain_decoding_on_it(folder, kv):
    """Greedy prompt lookup on q8_0 (q4_0) gives exactly plain greedy decoding on q8_0 (q4_0), with and without
    the prefix cache. Skipped until the kernels run the type (kernels.kv_types)."""
    if not _kernels_run(kv):
        pytest.skip(f"the kernels do not run {kv} yet")
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine.generate import Engine, GenerationConfig
    from specdec.models.loader import load_model

    model = load_model(str(folder), "fp16", kv_cache=kv).model
    prompt = [2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 5, 6, 7]
    cfg = GenerationConfig(24)
    plain = Engine(model, None).generate([prompt], cfg, None, 1)[0].token_ids
    assert Engine(model, None).generate([prompt], cfg, NgramDrafter(3, 1), 4)[0].token_ids == plain
    cached = Engine(model, None, prefix_cache=1)
    assert [cached.generate([prompt], cfg, NgramDrafter(3, 1), 4)[0].token_ids for _ in range(2)] == [plain, plain]
