"""`specdec serve`'s start-up, without a model or a socket: where the step loop runs, and what the start line says
about memory (serve/cli.py). Fast: fakes stand in for the worker and uvicorn."""

from __future__ import annotations

import signal
import threading

import pytest


def test_a_pool_larger_than_the_memory_left_is_named_at_start(capsys):
    """The pool is reserved, not taken, at start: a server whose slots could outgrow the machine says so, with
    the flags that shrink it, and one that fits says nothing."""
    from specdec.serve.cli import available_gib, warn_reserved

    assert warn_reserved(6.7, available=4.0)
    err = capsys.readouterr().err
    assert "6.7 GiB" in err and "4.0 GiB" in err and "--context" in err and "--max-batch" in err
    assert not warn_reserved(1.0, available=4.0) and capsys.readouterr().err == ""
    assert available_gib() is None or available_gib() > 0


class _FakeWorker:
    def __init__(self):
        self.ran_on, self.stopped = None, False
        self._stop = threading.Event()

    def run_here(self):
        self.ran_on = threading.current_thread()
        assert self._stop.wait(60), "the step loop was never told to stop"  # 60 s: only a bound on a hang

    def request_stop(self):
        self.stopped = True
        self._stop.set()


class _FakeHttp:
    def __init__(self, exit_code=None):
        self.ran_on, self.exit_code = None, exit_code

    def run(self):
        self.ran_on = threading.current_thread()
        if self.exit_code is not None:
            raise SystemExit(self.exit_code)

    def handle_exit(self, sig, frame):
        pass


@pytest.mark.parametrize("exit_code,status", [(None, 0), (0, 0), (1, 1)])
def test_the_step_loop_runs_on_the_thread_that_loaded_the_model(exit_code, status, capsys):
    """`specdec serve` steps the engine on its own (main) thread and serves HTTP from another: passes on a second
    thread ran 4.7x slower (serve/cli.py serve_on_this_thread). When HTTP ends, so does the step loop; uvicorn's
    failure to start is a status of 1 with a line saying so."""
    from specdec.serve.cli import serve_on_this_thread

    worker, http = _FakeWorker(), _FakeHttp(exit_code)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert serve_on_this_thread(worker, http) == status
        assert signal.getsignal(signal.SIGTERM) == http.handle_exit  # SIGTERM reaches uvicorn's graceful stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    assert worker.ran_on is threading.current_thread() and http.ran_on is not threading.current_thread()
    assert worker.stopped
    assert ("HTTP server stopped" in capsys.readouterr().err) == (status == 1)


def test_a_step_loop_that_fails_stops_http_too():
    """A bug in the step loop must not leave a server that answers but never decodes."""
    from specdec.serve.cli import serve_on_this_thread

    class Broken(_FakeWorker):
        def run_here(self):
            raise RuntimeError("a bug")

    class Waits(_FakeHttp):
        should_exit, told = False, False

        def run(self):
            for _ in range(6000):  # uvicorn's main loop checks should_exit every 0.1 s; 60 s: a hang
                if self.should_exit:
                    self.told = True
                    return
                threading.Event().wait(0.01)

    http = Waits()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(RuntimeError, match="a bug"):
            serve_on_this_thread(Broken(), http)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    assert http.told


def test_a_gguf_is_served_by_its_stem_and_a_second_start_measures_nothing(tmp_path, monkeypatch, capsys):
    """The served id is the file's stem (what a user would guess), and the path as given or absolute names the model
    too; the first start measures the path choice and the pass costs, the second reads both from the cache."""
    from fastapi.testclient import TestClient

    from specdec.cli import main
    from specdec.kernels import decode_kernels
    from specdec.models.gguf.synth import write
    from specdec.serve import cli

    if decode_kernels() is None:
        pytest.skip("the native kernels cannot be built here")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "My-Model-Q4_K_M.gguf", "tiny-llama", "Q4_K_M")
    apps = []
    monkeypatch.setattr(cli, "serve_on_this_thread", lambda worker, server: apps.append(server.config.app) or 0)
    port = ["--port", str(free_port()), "--max-batch", "2"]
    for start in (1, 2):
        capsys.readouterr()
        assert main(["serve", "--model", "My-Model-Q4_K_M.gguf", *port]) == 0
        err = capsys.readouterr().err
        measured = ("measured at this first load" in err, "measuring this model's pass costs" in err)
        assert measured == ((True, True) if start == 1 else (False, False)), err
        assert "serving My-Model-Q4_K_M (" in err and "policy auto (k <= 8)" in err
    client = TestClient(apps[-1])
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["My-Model-Q4_K_M"]
    state = apps[-1].state.specdec
    assert {"My-Model-Q4_K_M.gguf", str(tmp_path / "My-Model-Q4_K_M.gguf")} <= set(state.cfg.aliases)
    missing = client.post("/v1/completions", json={"model": "other", "prompt": "w", "max_tokens": 1})
    assert missing.status_code == 404 and "My-Model-Q4_K_M" in missing.text


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
