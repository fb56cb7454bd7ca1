"""The path choice (models/gguf/path_choice.py): measured at a GGUF's first load (or by `specdec choose-path`) on a
tiny GGUF, written to the cache, read back by later loads as the file's default (said on stderr), forgotten when the
file changes, measured again where the store is torn or foreign, kept in memory where the cache cannot be written,
and replaced by the rule for a file too large to load twice."""

from __future__ import annotations

import json
import os

import pytest

from specdec.cli import main
from specdec.models.gguf.path_choice import PATHS, RULE, PathChoice, key, remember, remembered
from specdec.models.gguf.synth import write
from specdec.models.loader import load_model


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return write(tmp_path / "tiny-llama.gguf", "tiny-llama", "Q4_K_M").path


def choice(precision: str) -> PathChoice:
    return PathChoice(precision, {"gguf-q16": {"1": 2.0}, "gguf-q8": {"1": 1.0}}, "a test's", None, "today")


def test_the_first_load_measures_and_later_loads_read_the_choice(tiny, kernels, capsys):  # noqa: F811
    first = load_model(str(tiny))
    assert first.model.precision in ("gguf-q16", "gguf-q8")
    err = capsys.readouterr().err
    assert "measured at this first load" in err and "the faster path for this file" in err
    got = remembered(tiny)
    assert got is not None and got.precision == first.model.precision and set(got.pass_ms) == set(PATHS)
    assert sum(got.pass_ms[got.precision].values()) == min(sum(v.values()) for v in got.pass_ms.values())
    again = load_model(str(tiny))
    err = capsys.readouterr().err
    assert again.model.precision == got.precision and "measured at this first load" not in err
    assert f"{got.precision}, the faster path for this file on this CPU" in err and err.count("\n") <= 2


def test_the_loader_takes_the_remembered_path_and_says_so(tiny, kernels, capsys):  # noqa: F811
    for path in PATHS:
        remember(tiny, choice(path))
        capsys.readouterr()
        assert load_model(str(tiny)).model.precision == path
        assert f"{path}, the faster path for this file on this CPU" in capsys.readouterr().err
    assert load_model(str(tiny), "gguf-q16").model.precision == "gguf-q16"  # --precision overrides


def test_a_torn_or_foreign_store_is_measured_again(tiny, tmp_path, kernels, capsys):  # noqa: F811
    store = tmp_path / "cache" / "path-choices.json"
    for broken in ('{"torn": ', json.dumps({key(tiny): {"precision": "fp64", "pass_ms": {}}})):
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(broken)
        capsys.readouterr()
        load_model(str(tiny))
        assert "measured at this first load" in capsys.readouterr().err
        assert remembered(tiny) is not None and json.loads(store.read_text())[key(tiny)]["precision"] in PATHS


def test_an_unwritable_cache_measures_in_memory_in_one_line(tiny, tmp_path, kernels, capsys, monkeypatch):  # noqa: F811
    load_model(str(tiny), "gguf-q8")  # converted while the cache can be written
    store = tmp_path / "cache" / "path-choices.json"
    store.mkdir(parents=True)  # a folder where the file should be: it cannot be written
    capsys.readouterr()
    assert load_model(str(tiny)).model.precision in PATHS
    err = capsys.readouterr().err
    assert "kept in memory only" in err and "Traceback" not in err and len(err.strip().splitlines()) == 2


def test_a_file_too_large_to_load_twice_gets_the_rule(tiny, kernels, capsys, monkeypatch):  # noqa: F811
    from specdec.models import loader

    monkeypatch.setattr(loader, "available_bytes", lambda: tiny.stat().st_size)  # not twice the file
    capsys.readouterr()
    assert load_model(str(tiny)).model.precision == RULE
    err = capsys.readouterr().err
    assert "too large to load on both paths" in err and remembered(tiny) is None


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
