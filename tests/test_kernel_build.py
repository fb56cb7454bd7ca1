"""The kernel cache cannot be poisoned: a build's lock dies with its holder, a waiter says whom it waits for, a
failed build leaves nothing a later process loads, and a build killed midway (SIGKILL to the compiling process,
as a test's timeout does) leaves the next process to build in its normal time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.kernels import build as kbuild


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
    child.wait(60)
    assert kbuild.lock_path(build).exists()  # the file stays behind, and means nothing
    assert kbuild.read_holder(build) is None
    said = []
    with kbuild.BuildLock(build, said.append):
        assert kbuild.read_holder(build).pid == os.getpid()
    assert said == []  # taken at once (a waiter says so before it blocks), without a word


def test_a_waiter_says_whose_build_it_waits_for(tmp_path):
    """The holder is killed once the waiter has said whom it waits for (not after a fixed sleep, which a busy
    machine could outlast before the waiter even asked), and the waiter then gets the lock."""
    build = tmp_path / "abc"
    child = hold_lock_in_child(build)
    said = []

    def say(message: str) -> None:
        said.append(message)
        child.kill()  # the waiter blocks next, until the holder's death releases the lock

    try:
        with kbuild.BuildLock(build, say):
            assert kbuild.read_holder(build).pid == os.getpid()
    finally:
        child.kill()
        child.wait(60)
    assert len(said) == 1 and f"waiting for the kernel build in PID {child.pid}, started" in said[0], said


def c_module(name: str, body: str) -> str:
    """A Python extension module in plain C API (no torch headers, so it compiles in about a second) whose
    function two() returns 2; `body` goes before it."""
    return (f"#include <Python.h>\n{body}\n"
            "static PyObject* two(PyObject*, PyObject*) { return PyLong_FromLong(2); }\n"
            "static PyMethodDef methods[] = {{\"two\", two, METH_NOARGS, \"\"}, {nullptr, nullptr, 0, nullptr}};\n"
            f"static PyModuleDef def = {{PyModuleDef_HEAD_INIT, \"{name}\", nullptr, -1, methods}};\n"
            f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&def); }}\n")


def test_a_failed_build_leaves_nothing_to_load_and_the_next_one_builds(tmp_path):
    bad, good = tmp_path / "bad.cpp", tmp_path / "good.cpp"
    bad.write_text(c_module("specdec_test_bad", "this is not C++;"))
    good.write_text(c_module("specdec_test_good", ""))
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


def slow_c_module(name: str, functions: int = 3000) -> str:
    """c_module() padded with `functions` small loops: some seconds of compiling at -O3, long enough to be
    killed midway."""
    pad = "".join(f"double f{i}(double x) {{ double s = 0; for (int j = 0; j < {i % 7 + 3}; j++) s += x * j + {i}; "
                  "return s; }\n" for i in range(functions))
    return c_module(name, pad)


BUILD_IN_CHILD = """import sys
from pathlib import Path
from specdec.kernels.build import build_module
print(build_module(sys.argv[1], [Path(sys.argv[2])], Path(sys.argv[3]), ["-O3"]).two(), flush=True)
"""


def test_a_build_killed_midway_does_not_stall_the_next_one(tmp_path):
    """Fails on the torch builder's own lock file, which outlived the killed process and made every later start
    wait without end. The path is the kernels' own (build_module: what `specdec kernels`, `generate` and `serve`
    call on first use), on a module that compiles in seconds instead of the kernels' minutes."""
    source = tmp_path / "slow.cpp"
    source.write_text(slow_c_module("specdec_test_slow"))
    build = tmp_path / "kernels" / "v1"
    command = [sys.executable, "-c", BUILD_IN_CHILD, "specdec_test_slow", str(source), str(build)]
    first = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert "compiling" in first.stderr.readline()
        deadline = time.monotonic() + 60
        while not any(p.suffix in (".o", ".ninja") for p in build.parent.rglob("*")):
            assert time.monotonic() < deadline and first.poll() is None, "the first build never started"
            time.sleep(0.1)
        time.sleep(1)  # the compiler is running
        first.send_signal(signal.SIGKILL)  # the building process: torch's lock file and the half build stay
        first.wait(60)
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)  # its orphaned compiler too
        except ProcessLookupError:
            pass
    assert not (build / "specdec_test_slow.so").exists()  # killed before it finished
    assert list(build.parent.glob(f".v1{kbuild.BUILD_PREFIX}*"))  # the half build it left
    t0 = time.monotonic()
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert second.returncode == 0 and second.stdout.strip() == "2", second.stderr
    assert "waiting" not in second.stderr and "Traceback" not in second.stderr, second.stderr
    assert not list(build.parent.glob(f".v1{kbuild.BUILD_PREFIX}*"))  # the half build is gone
    print(f"the second process built and loaded the module in {took:.1f} s")


def test_a_finished_file_that_will_not_load_is_built_again(tmp_path):
    """A damaged module in the cache (a disk that failed mid-copy, say) is replaced, not loaded or kept."""
    build = tmp_path / "v1"
    build.mkdir()
    (build / "specdec_test_broken.so").write_bytes(b"\x7fELF truncated")
    said = []
    assert kbuild.load_finished("specdec_test_broken", build / "specdec_test_broken.so", said.append) is None
    assert not (build / "specdec_test_broken.so").exists() and "building again" in said[0]
