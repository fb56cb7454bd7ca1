"""Hostile files and command-line input (issue 35, item 4): each case runs the real CLI entry, which must exit with
status 2 and one line on stderr starting `specdec: error:` that names what is wrong, never a traceback; results
files already there stay as they were, and a failed write leaves no temporary file behind.

Kinds covered: numeric flags out of range on every subcommand; missing, folder-as-file and undecodable input
paths; output paths that cannot be files; a full disk (a real one, /dev/full, and ENOSPC at the rename or the
flush) and an unwritable folder while writing results; truncated and corrupt GGUFs; model folders with a config,
tokenizer or weights that are broken, missing or of the wrong shape; draft heads that are corrupt or for another
tokenizer; profile and bench JSON of the wrong shape; prompt files with bad lines."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import specdec.atomic
from specdec.cli import main
from tests.conftest import information_line, write_word_tokenizer
from tests.serving import write_served_model

NO_MODEL = "/nonexistent/model"  # where a case must fail before any model loads: a slip shows as "model not found"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A loadable tiny model folder (64 positions, word tokenizer "w0 w1 ...")."""
    return write_served_model(tmp_path_factory.mktemp("model"), context=64)


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    from tests.test_gguf_convert import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path.read_bytes()


def fails(capsys, *argv, needle: str = "") -> str:
    """Run `specdec ARGV`: status 2, one `specdec: error:` line containing `needle`, no traceback. (A command that
    failed after loading has said what loading says (conftest.information_line): information, not the error.)"""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in err.strip().splitlines() if not information_line(line)]
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    assert "Traceback" not in out + err
    assert needle in lines[0], lines[0]
    return lines[0]


def generate(model, *extra) -> list:
    return ["generate", "--model", model, "--precision", "fp32", "--prompt", "w1 w2", "--max-new-tokens", "2",
            "--no-chat", "--json", *extra]


# ---- numeric flags, every subcommand ---------------------------------------------------------------------------

BENCH = ["bench", "--prompts", "/dev/null", "--model", NO_MODEL, "--quiet"]
LOAD = ["loadtest", "--url", "http://127.0.0.1:9", "--prompts", "/dev/null"]
AUDIT = ["audit", "--endpoint", "http://127.0.0.1:9", "--reference", "http://127.0.0.1:9"]
SERVE = ["serve", "--model", NO_MODEL]
TRAIN = ["train-draft", "--target", NO_MODEL, "--out", "/nonexistent/out"]
GEN = ["generate", "--model", NO_MODEL, "--prompt", "w1"]
FLAGS = {
    "generate k=0": ([*GEN, "--k", "0"], "--k must be an integer >= 1"),
    "generate k<0": ([*GEN, "--k", "-3"], "--k must be an integer >= 1"),
    "generate k huge": ([*GEN, "--k", "100000"], "--k must be at most 256"),
    "bench k huge": ([*BENCH, "--k", "100000"], "--k must be at most 256"),
    "generate max-new-tokens=0": ([*GEN, "--max-new-tokens", "0"], "max new tokens must be >= 1"),
    "generate temperature<0": ([*GEN, "--temperature", "-1"], "--temperature must be >= 0"),
    "generate temperature=nan": ([*GEN, "--temperature", "nan"], "--temperature must be >= 0, got nan"),
    "generate temperature=inf": ([*GEN, "--temperature", "inf"], "--temperature must be >= 0, got inf"),
    "generate top-p=0": ([*GEN, "--top-p", "0"], "--top-p must be in (0, 1]"),
    "generate top-p>1": ([*GEN, "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    "generate top-k<0": ([*GEN, "--top-k", "-1"], "--top-k must be >= 0"),
    "generate seed<0": ([*GEN, "--seed", "-1"], "--seed must be in 0.."),
    "generate ngram-max=0": ([*GEN, "--ngram-max", "0"], "--ngram-max must be >= 1"),
    "generate ngram-min>max": ([*GEN, "--ngram-min", "5", "--ngram-max", "2"], "n-gram sizes need"),
    "demo max-new-tokens=0": (["demo", "--model", NO_MODEL, "--max-new-tokens", "0"], "--max-new-tokens must be"),
    "profile reps=0": (["profile", "--model", NO_MODEL, "--reps", "0"], "--reps must be >= 1"),
    "profile max-rows=1": (["profile", "--model", NO_MODEL, "--max-rows", "1"], "--max-rows must be >= 2"),
    "profile k=0": (["profile", "--model", NO_MODEL, "--k", "0"], "--k: must be an integer in 1..256"),
    "profile batch-context=0": (["profile", "--model", NO_MODEL, "--batch-context", "0"], "--batch-context must"),
    "profile memory-budget=0": (["profile", "--model", NO_MODEL, "--memory-budget-gb", "0"], "must be positive"),
    "profile bandwidth=nan": (["profile", "--model", NO_MODEL, "--bandwidth-gib", "nan"], "--bandwidth-gib must"),
    "profile contexts=0": (["profile", "--model", NO_MODEL, "--contexts", "0,8"], "--contexts: expected integers"),
    "bench max-new-tokens=0": ([*BENCH, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    "bench per-category=0": ([*BENCH, "--per-category", "0"], "--per-category must be >= 1"),
    "bench drift-margin<0": ([*BENCH, "--drift-margin", "-0.1"], "--drift-margin must be >= 0"),
    "bench llamacpp-k=0": ([*BENCH, "--llamacpp-k", "0"], "--llamacpp-k must be >= 1"),
    "bench timeout=0": ([*BENCH, "--timeout", "0"], "--timeout must be positive"),
    "bench concurrency=0": ([*BENCH, "--endpoint", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
    "plan alpha>1": (["plan", "--alpha", "1.5"], "acceptance rate must be in [0, 1]"),
    "plan max-k=0": (["plan", "--alpha", "0.5", "--max-k", "0"], "max k must be an integer >= 1"),
    "plan max-k huge (was a hang)": (["plan", "--alpha", "0.5", "--max-k", "100000000"], "max k must be"),
    "plan draft-cost<0": (["plan", "--alpha", "0.5", "--draft-cost", "-1"], "draft cost must be"),
    "plan knee-rows<0": (["plan", "--emit", "vllm", "--alpha", "0.5", "--knee-rows", "-1"], "knee rows must be"),
    "plan ngram-min=0": (["plan", "--emit", "vllm", "--alpha", "0.5", "--ngram-min", "0"], "n-gram sizes need"),
    "batch-model k=0": (["batch-model", "--alpha", ".5", "--k", "0", "--draft-cost", ".1", "--knee-rows", "8"],
                        "--k: must be an integer in 1..256"),
    "batch-model max-batch=0": (["batch-model", "--alpha", ".5", "--k", "2", "--draft-cost", ".1", "--knee-rows",
                                 "8", "--max-batch", "0"], "max batch must be"),
    "batch-model max-batch huge (was a hang)": (["batch-model", "--alpha", ".5", "--k", "2", "--draft-cost", ".1",
                                                 "--knee-rows", "8", "--max-batch", "1000000000"], "max batch must"),
    "simulate rounds=0": (["simulate", "--alpha", ".5", "--k", "2", "--rounds", "0"], "rounds must be"),
    "simulate rounds huge (was out of memory)": (["simulate", "--alpha", ".5", "--k", "2", "--rounds", "10" * 6],
                                                 "rounds must be an integer in 1..100000000"),
    "simulate k huge (was out of memory)": (["simulate", "--alpha", ".5", "--k", "100000"], "--k: must be an"),
    "simulate seed<0 (was a traceback)": (["simulate", "--alpha", ".5", "--k", "2", "--seed", "-1"], "--seed must"),
    "serve port=0": ([*SERVE, "--port", "0"], "--port must be in 1..65535"),
    "serve port>65535": ([*SERVE, "--port", "70000"], "--port must be in 1..65535"),
    "serve k=0": ([*SERVE, "--k", "0"], "--k must be an integer >= 1"),
    "serve max-batch=0": ([*SERVE, "--max-batch", "0"], "--max-batch must be >= 1"),
    "serve max-queue<0": ([*SERVE, "--max-queue", "-1"], "--max-queue must be >= 0"),
    "serve context too small": ([*SERVE, "--context", "1"], "--context must be >= 2"),
    "serve prefix-cache<0": ([*SERVE, "--prefix-cache", "-1"], "--prefix-cache must be >= 0"),
    "serve prefill-chunk<0": ([*SERVE, "--prefill-chunk", "-1"], "--prefill-chunk must be >= 0"),
    "serve max-tokens-default=0": ([*SERVE, "--max-tokens-default", "0"], "--max-tokens-default must be >= 1"),
    "serve max-body-bytes tiny": ([*SERVE, "--max-body-bytes", "10"], "--max-body-bytes must be >= 1024"),
    "loadtest requests=0": ([*LOAD, "--requests-per-client", "0"], "--requests-per-client must be >= 1"),
    "loadtest max-tokens=0": ([*LOAD, "--max-tokens", "0"], "--max-tokens must be >= 1"),
    "loadtest temperature<0": ([*LOAD, "--temperature", "-1"], "--temperature must be >= 0"),
    "loadtest timeout=0": ([*LOAD, "--timeout", "0"], "--timeout must be positive"),
    "loadtest seed<0": ([*LOAD, "--seed", "-5"], "--seed must be"),
    "loadtest concurrency=0": ([*LOAD, "--concurrency", "0"], "--concurrency: expected integers >= 1"),
    "audit samples<10": ([*AUDIT, "--samples", "5"], "--samples must be >= 10"),
    "audit max-tokens=1": ([*AUDIT, "--max-tokens", "1"], "--max-tokens must be in 2..64"),
    "audit temperature=0": ([*AUDIT, "--temperature", "0"], "--temperature must be in (0, 2]"),
    "audit top-p>1": ([*AUDIT, "--top-p", "2"], "--top-p must be in (0, 1]"),
    "audit significance=1": ([*AUDIT, "--significance", "1"], "--significance must be in (0, 1)"),
    "audit alpha=1 (the old spelling)": ([*AUDIT, "--alpha", "1"], "--alpha must be in (0, 1)"),
    "audit concurrency=0": ([*AUDIT, "--concurrency", "0"], "--concurrency must be >= 1"),
    "audit timeout<0": ([*AUDIT, "--timeout", "-1"], "--timeout must be positive"),
    "audit seed<0": ([*AUDIT, "--seed", "-1"], "--seed must be in 0.."),
    "train-draft steps=0": ([*TRAIN, "--steps", "0"], "--steps must be >= 1"),
    "train-draft epochs=0": ([*TRAIN, "--epochs", "0"], "--epochs must be positive"),
    "train-draft lr=nan (was a traceback)": ([*TRAIN, "--lr", "nan"], "--lr must be positive"),
    "train-draft hours<0": ([*TRAIN, "--hours", "-1"], "--hours must be positive"),
    "train-draft draft-vocab=0": ([*TRAIN, "--draft-vocab", "0"], "--draft-vocab must be >= 1"),
    "train-draft max-tokens has 0": ([*TRAIN, "--max-tokens", "4", "0"], "--max-tokens must be >= 1"),
    "not a number": ([*SERVE, "--max-batch", "eight"], "invalid int value: 'eight'"),
}


@pytest.mark.parametrize("argv, needle", list(FLAGS.values()), ids=list(FLAGS))
def test_numeric_flag_out_of_range(capsys, argv, needle):
    fails(capsys, *argv, needle=needle)


# ---- input paths -----------------------------------------------------------------------------------------------

@pytest.fixture
def undecodable(tmp_path) -> Path:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    return path


def test_input_paths(capsys, tmp_path, model, undecodable):
    missing, folder = tmp_path / "missing" / "x.json", tmp_path
    cases = [
        (["generate", "--prompt-file", missing, "--model", model], "cannot read"),
        (["generate", "--prompt-file", folder, "--model", model], "Is a directory"),
        (["generate", "--prompt-file", undecodable, "--model", model], "not a UTF-8 text file"),
        (["generate", "--prompt", "w1 \udcff", "--model", model], "the prompt is not UTF-8 text"),  # argv's bytes
        (generate(missing), "model not found"),
        (generate(undecodable), "a model is a folder (config.json + safetensors) or a .gguf file"),
        (generate(folder), "no config.json in this folder"),
        (["bench", "--prompts", missing, "--model", model], "prompt file not found"),
        (["bench", "--prompts", folder, "--model", model], "prompt file not found"),
        (["bench", "--prompts", undecodable, "--model", model, "--quiet"], "not a UTF-8 text file"),
        (["plan", "--alpha", ".5", "--profile", missing], "No such file"),
        (["plan", "--alpha", ".5", "--profile", folder], "Is a directory"),
        (["plan", "--alpha", ".5", "--verify-cost", missing], "No such file"),
        (["plan", "--emit", "vllm", "--from-bench", folder], "cannot read"),
        ([*SERVE, "--profile", missing], "No such file"),
        ([*AUDIT, "--prompts", folder], "Is a directory"),
        ([*AUDIT, "--prompts", undecodable], "not a UTF-8 text file"),
        (["loadtest", "--url", "http://127.0.0.1:9", "--prompts", missing], "prompt file not found"),
        (["train-draft", "--target", NO_MODEL, "--out", tmp_path / "o", "--prompts", folder], "no prompts file"),
        (generate(model, "--drafter", "eagle", "--draft-head", missing), "not a draft head"),
        (["export-draft", missing, "--out", tmp_path / "e"], "not a draft head"),
    ]
    for argv, needle in cases:
        fails(capsys, *argv, needle=needle)


def test_undecodable_prompt_on_stdin(capsys, monkeypatch, model):
    """Was a traceback from the tokenizer (a lone surrogate), or from reading stdin in a strict locale."""
    for errors in ("strict", "surrogateescape"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"w1 \xff\xfe"), "utf-8", errors))
        fails(capsys, "generate", "--model", model, needle="not UTF-8 text")


# ---- output paths, full disks ----------------------------------------------------------------------------------

@pytest.fixture
def results(tmp_path) -> dict[str, Path]:
    """Results files from an earlier run, which no failure may touch."""
    files = {name: tmp_path / "out" / name for name in ("bench.json", "bench.md", "plot.png", "trace.json")}
    files["bench.json"].parent.mkdir()
    for path in files.values():
        path.write_text(f"previous {path.name}")
    return files


def unchanged(results: dict[str, Path]) -> None:
    for path in results.values():
        assert path.read_text() == f"previous {path.name}", path
    assert sorted(p.name for p in results["bench.json"].parent.iterdir()) == sorted(results), "a temporary file"


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_output_paths_that_cannot_be_files(capsys, tmp_path, model, results):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    bench = ["bench", "--prompts", prompts, "--model", model, "--precision", "fp32", "--quiet"]
    nowhere = tmp_path / "no" / "such" / "folder" / "x.json"
    cases = [
        ([*bench, "--json", tmp_path], "it is a folder"),
        ([*bench, "--markdown", nowhere], "its folder does not exist"),
        ([*bench, "--plot", results["bench.md"]], "cannot write a plot as"),
        ([*bench, "--json", results["bench.json"], "--markdown", results["bench.json"]], "must name different"),
        (["profile", "--model", model, "--json", tmp_path], "it is a folder"),
        (generate(model, "--trace", tmp_path), "it is a folder"),
        (generate(model, "--trace", nowhere), "its folder does not exist"),
        (["plan", "--alpha", ".5", "--plot", tmp_path], "it is a folder"),
        (["batch-model", "--alpha", ".5", "--k", "2", "--draft-cost", ".1", "--knee-rows", "8", "--plot", nowhere],
         "its folder does not exist"),
        ([*LOAD, "--json", tmp_path], "it is a folder"),
    ]
    for argv, needle in cases:
        fails(capsys, *argv, needle=needle)
    unchanged(results)


def test_full_disk_at_the_rename_keeps_every_previous_result(capsys, tmp_path, model, results, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    monkeypatch.setattr(os, "replace", enospc)
    fails(capsys, "bench", "--prompts", prompts, "--model", model, "--precision", "fp32", "--quiet",
          "--max-new-tokens", "2", "--json", results["bench.json"], "--markdown", results["bench.md"],
          "--plot", results["plot.png"], needle="No space left on device")
    fails(capsys, "plan", "--alpha", ".6", "--plot", results["plot.png"], needle=f"cannot write {results['plot.png']}")
    fails(capsys, *generate(model, "--trace", results["trace.json"]), needle="No space left on device")
    unchanged(results)


def test_full_disk_while_writing(capsys, results, monkeypatch):
    monkeypatch.setattr(os, "fsync", enospc)  # as a write that the file system refuses at the flush
    fails(capsys, "batch-model", "--alpha", ".5", "--k", "2", "--draft-cost", ".1", "--knee-rows", "8", "--plot",
          results["plot.png"], needle="No space left on device")
    unchanged(results)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_real_full_disk(capsys, model):
    fails(capsys, "batch-model", "--alpha", ".5", "--k", "2", "--draft-cost", ".1", "--knee-rows", "8", "--plot",
          "/dev/full", needle="cannot write /dev/full: No space left on device")
    fails(capsys, *generate(model, "--trace", "/dev/full"), needle="No space left on device")


def test_an_unwritable_folder(capsys, results, monkeypatch):
    """Root writes anywhere (CI runs as root), so the refusal the kernel gives anyone else is made explicit."""
    def refuse(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(specdec.atomic, "_temporary", refuse)
    fails(capsys, "plan", "--alpha", ".6", "--plot", results["plot.png"], needle="Permission denied")
    unchanged(results)


def test_results_are_written_whole(capsys, tmp_path, results):
    """The same writers, when nothing fails, replace the previous file (and leave no temporary one)."""
    assert main(["plan", "--alpha", ".6", "--plot", str(results["plot.png"])]) == 0
    assert results["plot.png"].read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in results["plot.png"].parent.iterdir()) == sorted(results)


# ---- GGUF files --------------------------------------------------------------------------------------------------

def _set(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + value.to_bytes(8 if offset >= 8 else 4, "little") + data[offset + (8 if offset >= 8 else 4):]


GGUFS = {
    "bad magic": (lambda g: b"GGUX" + g[4:], "not a GGUF file"),
    "garbage": (lambda g: bytes(range(256)) * 20, "not a GGUF file"),
    "empty": (lambda g: b"", "not a GGUF file"),
    "header cut": (lambda g: g[:20], "malformed or truncated GGUF file"),
    "tensor table cut": (lambda g: g[:len(g) // 40], "malformed or truncated GGUF file"),
    "data short by one byte": (lambda g: g[:-1], "malformed or truncated GGUF file"),
    "unknown version": (lambda g: _set(g, 4, 99), "malformed or truncated GGUF file"),
    "tensor count huge": (lambda g: _set(g, 8, 2**60), "malformed or truncated GGUF file"),
    "metadata count huge": (lambda g: _set(g, 16, 2**60), "malformed or truncated GGUF file"),
}


@pytest.mark.parametrize("make, needle", list(GGUFS.values()), ids=list(GGUFS))
def test_bad_gguf(capsys, tmp_path, gguf_bytes, make, needle):
    path = tmp_path / "model.gguf"
    path.write_bytes(make(gguf_bytes))
    fails(capsys, *generate(path), needle=f"{path}: {needle}")
    fails(capsys, *generate(path, "--precision", "gguf"), needle=needle)


# ---- model folders ---------------------------------------------------------------------------------------------

def _edit_config(**changes):
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                del cfg[key]
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


_DROP = object()


def _write(name: str, data: bytes):
    return lambda folder: (folder / name).write_bytes(data)


def _truncate_weights(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1])


def _weights(change):
    def edit(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        change(weights)
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return edit


def _shard_missing(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    first = {n: weights[n] for n in names[: len(names) // 2]}
    save_file(first, folder / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    index = {n: f"model-0000{1 if n in first else 2}-of-00002.safetensors" for n in names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))


FOLDERS = {
    "config.json not JSON": (_write("config.json", b"{not json"), "unreadable config.json"),
    "config.json a list": (_write("config.json", b"[1, 2]"), "config.json holds a list, not an object"),
    "config.json lacks a field": (_edit_config(hidden_size=_DROP), "config.json has no hidden_size"),
    "config.json field a string": (_edit_config(hidden_size="big"), 'hidden_size must be an integer >= 1, got "big"'),
    "config.json zero heads": (_edit_config(num_attention_heads=0), "num_attention_heads must be an integer >= 1"),
    "config.json heads not divisible": (_edit_config(num_key_value_heads=3), "is not a multiple of"),
    "config.json eps negative": (_edit_config(rms_norm_eps=-1), "rms_norm_eps must be a positive number"),
    "tokenizer.json not JSON": (_write("tokenizer.json", b"{garbage"), "tokenizer.json: cannot load tokenizer"),
    "tokenizer.json a list": (_write("tokenizer.json", b"[]"), "tokenizer.json: cannot load tokenizer"),
    "tokenizer.json missing": (lambda f: (f / "tokenizer.json").unlink(), "cannot load tokenizer"),
    "tokenizer_config.json not JSON": (_write("tokenizer_config.json", b"{x"), "tokenizer_config.json: cannot read"),
    "safetensors garbage": (_write("model.safetensors", bytes(range(256)) * 8), "not a readable safetensors file"),
    "safetensors short by one byte": (_truncate_weights, "not a readable safetensors file"),
    "safetensors missing": (lambda f: (f / "model.safetensors").unlink(), "no weights in this folder"),
    "safetensors shard missing": (_shard_missing, "shard model-00002-of-00002.safetensors (named by"),
    "safetensors index not JSON": (_write("model.safetensors.index.json", b"{"), "not a safetensors index"),
    "tensor missing": (_weights(lambda w: w.pop("model.layers.1.mlp.up_proj.weight")),
                       "the weights have no model.layers.1.mlp.up_proj.weight"),
    "tensor of the wrong shape": (_weights(lambda w: w.update({"model.norm.weight": w["model.norm.weight"][:-1]})),
                                  "model.norm.weight has shape [63], but config.json implies [64]"),
}


@pytest.mark.parametrize("breakage, needle", list(FOLDERS.values()), ids=list(FOLDERS))
def test_broken_model_folder(capsys, tmp_path, model, breakage, needle):
    folder = tmp_path / "m"
    shutil.copytree(model, folder)
    breakage(folder)
    fails(capsys, *generate(folder), needle=needle)


# ---- draft heads -----------------------------------------------------------------------------------------------

@pytest.fixture
def head(tmp_path, model) -> Path:
    """An (untrained) EAGLE-3 head for the tiny model, saved as `specdec train-draft` saves one."""
    from specdec.heads.eagle import EagleHead, HeadConfig, default_taps
    from specdec.models.config import ModelConfig
    from specdec.models.text.tokenizer import Tokenizer

    cfg = ModelConfig.from_dir(model)
    path = tmp_path / "head"
    EagleHead(HeadConfig.for_target(cfg, 16, default_taps(cfg.num_layers))).save(
        path, meta={"tokenizer_fingerprint": Tokenizer.from_dir(model).fingerprint()})
    return path


def test_bad_draft_heads(capsys, tmp_path, model, head):
    assert main([str(a) for a in generate(model, "--drafter", "eagle", "--draft-head", head)]) == 0  # it loads
    other = tmp_path / "other"  # the same architecture with another vocabulary
    shutil.copytree(model, other)
    write_word_tokenizer(other, ["<unk>", "<eos>", *[f"v{i}" for i in range(30)]])
    fails(capsys, *generate(other, "--drafter", "eagle", "--draft-head", head),
          needle="this draft head was trained for a target with another vocabulary")
    fails(capsys, "train-draft", "--target", other, "--init", head, "--out", tmp_path / "o", "--prompts", __file__,
          "--max-tokens", "2", needle="another vocabulary")
    (head / "head.json").write_text(json.dumps(json.loads((head / "head.json").read_text()) | {"hidden": "x"}))
    fails(capsys, *generate(model, "--drafter", "eagle", "--draft-head", head), needle="not a draft head")
    (head / "head.json").write_text("[]")
    fails(capsys, *generate(model, "--drafter", "eagle", "--draft-head", head), needle="not a draft head")
    (head / "model.safetensors").write_bytes(b"\x00" * 100)  # was a traceback (SafetensorError)
    fails(capsys, "export-draft", head, "--out", tmp_path / "e", needle="not a draft head")


# ---- profile and bench JSON of the wrong shape -------------------------------------------------------------------

CURVE = {"1": 1.0, "2": 1.1, "4": 1.3}
PROFILES = {
    "not JSON": ("{bad", "not valid JSON"),
    "empty": ("", "not valid JSON"),
    "a list": ([1, 2], "not a specdec profile (no 'verify_cost' curve)"),
    "no verify_cost": ({"model": "x"}, "not a specdec profile"),
    "verify_cost a list": ({"verify_cost": [1, 2]}, "verify_cost must be a non-empty object of n: cost"),
    "verify_cost empty": ({"verify_cost": {}}, "verify_cost must be a non-empty object"),
    "cost a string": ({"verify_cost": {"1": "x", "2": 1.1}}, "verify_cost[1] must be a positive number, got \"x\""),
    "cost NaN": ('{"verify_cost": {"1": NaN, "2": 1.1}}', "verify_cost[1] must be a positive number, got NaN"),
    "row count not a number": ({"verify_cost": {"one": 1.0}}, "row count 'one' is not an integer >= 1"),
    "draft_cost a string": ({"verify_cost": CURVE, "draft_cost": "cheap"}, "draft_cost must be a number >= 0"),
    "step_s negative": ({"verify_cost": CURVE, "step_s": -1}, "step_s must be a positive number"),
    "knee a string": ({"verify_cost": CURVE, "knee": "x"}, "knee must be an object"),
    "knee rows a string": ({"verify_cost": CURVE, "knee": {"roofline_rows": "x"}}, "knee.roofline_rows must be"),
    "contexts not a list": ({"verify_cost": CURVE, "contexts": 5}, "contexts must be a list of objects"),
    "context without a curve": ({"verify_cost": CURVE, "contexts": [{"context": 128}]},
                                "contexts[0].verify_cost must be a non-empty object"),
}


def _json_file(path: Path, content) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("content, needle", list(PROFILES.values()), ids=list(PROFILES))
def test_profile_of_the_wrong_shape(capsys, tmp_path, content, needle):
    path = _json_file(tmp_path / "profile.json", content)
    fails(capsys, "plan", "--alpha", ".6", "--profile", path, needle=needle)
    fails(capsys, *SERVE, "--profile", path, needle=needle)  # before the model loads


def test_profile_of_the_wrong_shape_for_bench(capsys, tmp_path):
    prompts = _json_file(tmp_path / "p.jsonl", {"prompt": "w1"})
    path = _json_file(tmp_path / "profile.json", {"verify_cost": {"1": "x"}})
    fails(capsys, "bench", "--prompts", prompts, "--model", NO_MODEL, "--profile", path,
          needle="verify_cost[1] must be a positive number")
    fails(capsys, "plan", "--alpha", ".6", "--verify-cost", path, needle="verify_cost[1] must be a positive number")
    fails(capsys, "plan", "--emit", "vllm", "--alpha", ".6", "--profile",
          _json_file(tmp_path / "knee.json", {"verify_cost": CURVE, "knee": {"threshold_rows": -2}}),
          needle="knee.threshold_rows must be a positive number")


def _report(overall, drop: str = "") -> dict:
    """A bench report as `bench --json` writes it (read typed: bench/records.py), one method's overall group
    changed by `overall` (its keys replaced) and `drop` (a key removed)."""
    from specdec.bench.records import BenchReport, GroupResult, MethodResult

    group = GroupResult(prompts=1, tokens=8, seconds=1.0, tokens_per_s=8.0, tokens_per_pass=2.0, drafted=4, accepted=2,
                        alpha=0.5, acceptance_by_position=[0.5], draft_lengths={}, ttft_s=None, itl_p50_s=None,
                        itl_p99_s=None, burst_share=None, disturbance_max=None)
    report = BenchReport(config={}, categories=[], methods=[], prediction_source=None, prediction_costs="",
                         results={"ngram k=5": MethodResult(categories={}, overall=group)}).to_json()
    if isinstance(overall, dict):
        report["results"]["ngram k=5"]["overall"].update(overall)
        report["results"]["ngram k=5"]["overall"].pop(drop, None)
    else:
        report["results"]["ngram k=5"]["overall"] = overall
    return report


REPORTS = {
    "a list": ([], "not a `specdec bench --json` report"),
    "no results": ({"config": {}}, "not a `specdec bench --json` report"),
    "results a list": ({"results": [1]}, "not a `specdec bench --json` report"),
    "method without overall": ({"results": {"m": {}}}, "missing field 'config'"),
    "overall a list": (_report([]), "results.ngram k=5.overall: expected an object, got []"),
    "alpha a string": (_report({"alpha": "high"}), "results.ngram k=5.overall.alpha: expected a number"),
    "alpha above 1": (_report({"alpha": 7}), "overall.alpha must be a number in [0, 1], got 7"),
    "drafted missing": (_report({}, drop="drafted"), "results.ngram k=5.overall: missing field 'drafted'"),
    "a_i not a list": (_report({"acceptance_by_position": 5}), "overall.acceptance_by_position: expected a list"),
    "a_i a string": (_report({"acceptance_by_position": ["x"]}),
                     "overall.acceptance_by_position[0]: expected a number, got 'x'"),
    "a_i above 1": (_report({"acceptance_by_position": [2]}), "acceptance_by_position[0] must be a number in [0, 1]"),
    "no acceptance measured": (_report({"alpha": None, "drafted": 0}), "no method in it measured an acceptance"),
}


@pytest.mark.parametrize("content, needle", list(REPORTS.values()), ids=list(REPORTS))
def test_bench_report_of_the_wrong_shape(capsys, tmp_path, content, needle):
    path = _json_file(tmp_path / "bench.json", content)
    fails(capsys, "plan", "--emit", "vllm", "--from-bench", path, needle=needle)


# ---- prompt files with bad lines -------------------------------------------------------------------------------

PROMPTS = {
    "not JSON": ('{"prompt": "w1"}\n{oops\n', ":2: not", ":2: not"),
    "a list": ("[1, 2]\n", ":1: expected an object with 'turns'", ":1: expected a string or an object"),
    "prompt a number": ('{"prompt": 5}\n', ":1: 'prompt' must be a non-empty string", ":1: expected a string"),
    "null": ("null\n", ":1: expected an object", ":1: expected a string"),
    "no lines": ("\n\n", "no prompts in this file", "no prompts"),
    "turns a string": ('{"turns": "x", "category": "a"}\n', ":1: 'turns' must be a non-empty list", ":1: expected"),
    "category missing": ('{"turns": ["x"]}\n', ":1: a Spec-Bench item needs a 'category' string", ":1: expected"),
    "duplicate ids": ('{"turns": ["x"], "category": "a", "question_id": 1}\n'
                      '{"turns": ["y"], "category": "a", "question_id": 1}\n', ":2: duplicate question id 1",
                      ":1: expected"),
}


@pytest.mark.parametrize("text, needle, audit_needle", list(PROMPTS.values()), ids=list(PROMPTS))
def test_prompts_file_with_bad_lines(capsys, tmp_path, text, needle, audit_needle):
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    fails(capsys, "bench", "--prompts", path, "--model", NO_MODEL, "--quiet", needle=needle)
    fails(capsys, "loadtest", "--url", "http://127.0.0.1:9", "--prompts", path, needle=needle)
    fails(capsys, *AUDIT, "--prompts", path, needle=audit_needle)


def test_training_prompts_that_do_not_fit(capsys, tmp_path, model):
    """Every prompt too long for the model's 64 positions with --max-tokens 60: was a traceback (max() of
    nothing) after the model loaded."""
    prompts = _json_file(tmp_path / "p.jsonl", {"prompt": "w1 w2 w3"})
    fails(capsys, "train-draft", "--target", model, "--prompts", prompts, "--max-tokens", "60", "--draft-vocab", "8",
          "--out", tmp_path / "o", needle="none of the 1 training prompts leaves room for 60 new tokens")


def test_the_installed_entry_point(tmp_path):
    """The same through `python -m specdec.cli` in its own process: exit status 2, one line, no traceback."""
    import subprocess

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    for argv, needle in [(["simulate", "--alpha", ".5", "--k", "2", "--seed", "-1"], "--seed must be"),
                         (["generate", "--model", str(bad), "--prompt", "x"], "malformed or truncated GGUF file")]:
        run = subprocess.run([sys.executable, "-m", "specdec.cli", *argv], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 2, run.stderr
        assert run.stderr.startswith("specdec: error: ") and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert needle in run.stderr and "Traceback" not in run.stderr


def test_serve_on_a_port_that_is_taken_is_one_line_before_the_model_loads(capsys):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = main(["serve", "--model", NO_MODEL, "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err, err
