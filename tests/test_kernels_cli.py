"""A kernel build that fails is a failure, not a quiet fallback, where it matters: `specdec kernels` exits 1 naming
why (make setup, and so CI, stops there), and with CI=true the native tests fail instead of skipping. With
SPECDEC_NO_KERNELS the kernels are off on purpose: the command builds nothing and exits 0, the tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import specdec.kernels as kernels_pkg
from specdec.cli import main
from tests.conftest import native_kernels


def refuse_to_compile(*args):
    raise RuntimeError("Error building extension 'specdec_decode_f16': [1/3] c++ -c module.cpp\n"
                       "module.cpp:1:10: fatal error: torch/extension.h: No such file or directory")


def test_specdec_kernels_exits_1_when_the_build_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(kernels_pkg.OFF, raising=False)
    monkeypatch.setattr(kernels_pkg, "_cpu_supports", lambda: True)
    monkeypatch.setattr(kernels_pkg, "compile_module", refuse_to_compile)
    assert main(["kernels"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    log = kernels_pkg.kernels_dir().with_suffix(".log")
    assert err == [f"specdec: error: the native kernels could not be built (RuntimeError: Error building extension "
                   f"'specdec_decode_f16': [1/3] c++ -c module.cpp); the whole output is in {log}"]
    assert "fatal error: torch/extension.h" in log.read_text()  # the compiler's own words, for whoever reads on


def test_specdec_kernels_exits_1_on_a_cpu_without_avx2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(kernels_pkg.OFF, raising=False)
    monkeypatch.setattr(kernels_pkg, "_cpu_supports", lambda: False)
    assert main(["kernels"]) == 1
    assert "could not be built (RuntimeError: this CPU has no AVX2)" in capsys.readouterr().err


def test_specdec_kernels_with_the_kernels_off_builds_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(kernels_pkg.OFF, "1")
    monkeypatch.setattr(kernels_pkg, "compile_module", refuse_to_compile)  # would fail the command if called
    assert main(["kernels"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "specdec: SPECDEC_NO_KERNELS is set: the native kernels are off, nothing was built; the torch path will run "
        "(slower, equally exact)"]
    assert not (tmp_path / "cache").exists()
    assert kernels_pkg.decode_kernels() is None  # and every other command runs without them


def test_a_real_build_with_a_broken_compiler_fails_the_command(tmp_path):
    """End to end, in a cache of its own: a `c++` that answers for its version (torch asks) but compiles nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cxx = bin_dir / "g++"
    cxx.write_text("#!/bin/sh\ncase \" $* \" in *' -c '*|*' -shared '*) echo 'g++: broken on purpose' >&2; exit 1;; "
                   "esac\nexec /usr/bin/env -u CXX g++ \"$@\"\n")
    cxx.chmod(0o755)
    env = {**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache"), "CXX": str(cxx), "PYTHONPATH": str(Path.cwd())}
    env.pop(kernels_pkg.OFF, None)
    r = subprocess.run([sys.executable, "-m", "specdec.cli", "kernels"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 1, r.stderr
    assert "specdec: error: the native kernels could not be built (RuntimeError: Error building extension" in r.stderr
    logs = list((tmp_path / "cache" / "kernels").glob("*.log"))
    assert len(logs) == 1 and "g++: broken on purpose" in logs[0].read_text()
    assert not list((tmp_path / "cache" / "kernels").rglob("*.so"))  # nothing a later process would load


@pytest.mark.parametrize("ci,off,outcome", [("true", None, "fail"), (None, None, "skip"), ("true", "1", "skip")],
                         ids=["ci", "not-ci", "ci-kernels-off"])
def test_the_native_tests_fail_in_ci_when_the_kernels_cannot_be_built(ci, off, outcome, monkeypatch):
    monkeypatch.setattr(kernels_pkg, "_built_once", lambda: None)  # what a failed build leaves decode_kernels
    for name, value in (("CI", ci), (kernels_pkg.OFF, off)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected) as e:
        native_kernels()
    if outcome == "fail":
        assert "CI=true" in str(e.value)
    elif off:
        assert "SPECDEC_NO_KERNELS is set" in str(e.value)


def test_the_kernels_off_for_a_while_are_not_off_for_good(monkeypatch):
    """SPECDEC_NO_KERNELS is read on every call, so a test that sets it leaves no None cached for the next."""
    calls = []
    monkeypatch.setattr(kernels_pkg, "_built_once", lambda: calls.append(1) or "module")
    monkeypatch.setenv(kernels_pkg.OFF, "1")
    assert kernels_pkg.decode_kernels() is None and calls == []
    monkeypatch.delenv(kernels_pkg.OFF)
    assert kernels_pkg.decode_kernels() == "module" and calls == [1]
