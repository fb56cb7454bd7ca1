"""`specdec choose-path` and the choice it remembers (models/gguf/path_choice.py): measured on a tiny GGUF, written to
the cache, read back by the loader as the file's default (said on stderr), and forgotten when the file changes."""

from __future__ import annotations

import json
import os

import pytest

from specdec.cli import main
from specdec.models.gguf.path_choice import PathChoice, key, remember, remembered
from specdec.models.gguf.synth import write
from specdec.models.loader import load_model
from tests.test_gguf_kernels import kernels  # noqa: F401 (fixture)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return write(tmp_path / "tiny-llama.gguf", "tiny-llama", "Q4_K_M").path


def choice(precision: str) -> PathChoice:
    return PathChoice(precision, {"gguf-q16": {"1": 2.0}, "gguf-q8": {"1": 1.0}}, "a test's", None, "today")


def test_the_loader_takes_the_remembered_path_and_says_so(tiny, kernels, capsys):  # noqa: F811
    assert load_model(str(tiny)).model.precision == "gguf-q16"  # nothing remembered: the default
    remember(tiny, choice("gguf-q8"))
    capsys.readouterr()
    assert load_model(str(tiny)).model.precision == "gguf-q8"
    assert "gguf-q8, the path `specdec choose-path` measured fastest" in capsys.readouterr().err
    assert load_model(str(tiny), "gguf-q16").model.precision == "gguf-q16"  # --precision overrides


def test_a_changed_file_or_a_broken_store_forgets(tiny, tmp_path):
    remember(tiny, choice("gguf-q8"))
    assert remembered(tiny).precision == "gguf-q8"
    stat = tiny.stat()
    os.utime(tiny, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # the file changed: another key
    assert remembered(tiny) is None
    store = tmp_path / "cache" / "path-choices.json"
    for broken in ("not json", "[1, 2]", json.dumps({key(tiny): {"precision": "gguf-q8"}}),
                   json.dumps({key(tiny): {**choice("fp64").__dict__}})):
        store.write_text(broken)
        assert remembered(tiny) is None, broken


def test_choose_path_measures_both_and_remembers(tiny, kernels, capsys):  # noqa: F811
    assert main(["choose-path", "--model", str(tiny), "--reps", "1", "--rows", "3", "--context", "16"]) == 0
    out = capsys.readouterr().out
    assert "gguf-q16" in out and "gguf-q8" in out and "3 rows ms" in out and "remembered in" in out
    got = remembered(tiny)
    assert got is not None and got.precision in ("gguf-q16", "gguf-q8")
    assert set(got.pass_ms) == {"gguf-q16", "gguf-q8"} and set(got.pass_ms["gguf-q8"]) == {"1", "3"}
    assert sum(got.pass_ms[got.precision].values()) == min(sum(v.values()) for v in got.pass_ms.values())


@pytest.mark.parametrize("args, fragment", [(["--model", "nofile.gguf"], "takes a .gguf file"),
                                            (["--model", "x.gguf", "--rows", "0"], "--rows must be")])
def test_choose_path_bad_input(args, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["choose-path", *args]) == 2
    assert fragment in capsys.readouterr().err
