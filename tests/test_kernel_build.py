"""The kernel cache cannot be poisoned: a build's lock dies with its holder, a waiter says whom it waits for, a
failed build leaves nothing a later process loads, and a build killed midway (SIGKILL to the compiling process,
as a test's timeout does) leaves the next `specdec generate` to build and run in its normal time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.kernels import build as kbuild
from tests.conftest import write_tiny_model, write_word_tokenizer


def hold_lock_in_child(build: Path) -> subprocess.Popen:
    """A process that takes `build`'s lock and then sleeps, as a long compile would."""
    code = ("import sys, time; from pathlib import Path; from specdec.kernels.build import BuildLock\n"
            "with BuildLock(Path(sys.argv[1]), print):\n    print('held', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(build)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    build = tmp_path / "kernels" / "abc"
    assert kbuild.read_holder(build) is None  # no lock file: nobody builds
    child = hold_lock_in_child(build)
    holder = kbuild.read_holder(build)
    assert holder is not None and holder.pid == child.pid
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert kbuild.lock_path(build).exists()  # the file stays behind, and means nothing
    assert kbuild.read_holder(build) is None
    said = []
    t0 = time.monotonic()
    with kbuild.BuildLock(build, said.append):
        assert kbuild.read_holder(build).pid == os.getpid()
    assert time.monotonic() - t0 < 5 and said == []  # taken at once, without a word


def test_a_waiter_says_whose_build_it_waits_for(tmp_path):
    build = tmp_path / "abc"
    child = hold_lock_in_child(build)
    said = []
    try:
        killer = subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep(1.5); os.kill({child.pid}, 9)"])
        with kbuild.BuildLock(build, said.append):
            pass
        killer.wait(10)
    finally:
        child.kill()
        child.wait(10)
    assert len(said) == 1 and f"waiting for the kernel build in PID {child.pid}, started" in said[0], said


@pytest.mark.slow  # two small compiles, ~40 s
def test_a_failed_build_leaves_nothing_to_load_and_the_next_one_builds(tmp_path):
    bad, good = tmp_path / "bad.cpp", tmp_path / "good.cpp"
    bad.write_text("#include <torch/extension.h>\nthis is not C++;\n")
    good.write_text("#include <torch/extension.h>\nint two() { return 2; }\n"
                    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"two\", &two); }\n")
    build = tmp_path / "kernels" / "v1"
    said = []
    with pytest.raises(Exception):  # noqa: B017  torch raises RuntimeError or a subprocess error
        kbuild.build_module("specdec_test_bad", [bad], build, ["-O0"], said.append)
    assert not list(build.glob("*.so")) and not list(build.parent.glob(f".v1{kbuild.BUILD_PREFIX}*"))
    stale = build.parent / f".v1{kbuild.BUILD_PREFIX}left-by-a-killed-build"
    stale.mkdir()
    module = kbuild.build_module("specdec_test_good", [good], build, ["-O0"], said.append)
    assert module.two() == 2 and (build / "specdec_test_good.so").is_file() and not stale.exists()
    said.clear()
    assert kbuild.build_module("specdec_test_good", [good], build, ["-O0"], said.append).two() == 2
    assert said == []  # found finished: loaded without compiling or a word


@pytest.mark.slow
def test_a_build_killed_midway_does_not_stall_the_next_generate(tmp_path):
    """Fails on the torch builder's own lock file, which outlived the killed process and made every later start
    wait without end."""
    cache = tmp_path / "cache"
    env = {**os.environ, "SPECDEC_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    env.pop("SPECDEC_NO_KERNELS", None)
    model = write_tiny_model(tmp_path / "model", vocab=8, hidden=64, heads=4)
    write_word_tokenizer(model, ["<unk>", "<eos>", "a", "b", "c", "d", "e", "f"])
    generate = [sys.executable, "-m", "specdec.cli", "generate", "--model", str(model), "--prompt", "a b c",
                "--no-chat", "--max-new-tokens", "8", "--drafter", "ngram"]
    first = subprocess.Popen(generate, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert "compiling" in first.stderr.readline()
        deadline = time.monotonic() + 60
        while not any(p.suffix in (".o", ".ninja") for p in cache.rglob("*")):
            assert time.monotonic() < deadline and first.poll() is None, "the first build never started"
            time.sleep(0.2)
        time.sleep(2)  # the compilers are running
        first.send_signal(signal.SIGKILL)  # the building process only: its compilers live on as orphans
        first.wait(10)
        t0 = time.monotonic()
        second = subprocess.run(generate, env=env, capture_output=True, text=True,
                                timeout=float(os.environ.get("SPECDEC_BUILD_TIMEOUT", "900")))
        took = time.monotonic() - t0
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)  # the orphaned compilers, if any are left
        except ProcessLookupError:
            pass
    assert second.returncode == 0, second.stderr
    assert "kernels compiled" in second.stderr and "unavailable" not in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    print(f"the second process built the kernels and generated in {took:.0f} s")


def test_a_finished_file_that_will_not_load_is_built_again(tmp_path):
    """A damaged module in the cache (a disk that failed mid-copy, say) is replaced, not loaded or kept."""
    build = tmp_path / "v1"
    build.mkdir()
    (build / "specdec_test_broken.so").write_bytes(b"\x7fELF truncated")
    said = []
    assert kbuild.load_finished("specdec_test_broken", build / "specdec_test_broken.so", said.append) is None
    assert not (build / "specdec_test_broken.so").exists() and "building again" in said[0]
