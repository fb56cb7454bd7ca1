"""`specdec serve` subprocesses on 127.0.0.1 for the benchmarks that measure whole servers (`specdec loadtest
--servers`, `specdec bench endpoint-check`): started on a free port, waited for until GET /health answers,
stopped by their own PID. Nothing connects anywhere but 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specdec.client import RequestFailed, first_model, prometheus_series, run_async
from specdec.errors import SpecdecError

HOST = "127.0.0.1"


class BenchError(SpecdecError):
    """The benchmark cannot go on (a server did not start, a level failed); the message says why, with the
    server's last lines of output (so it is the one error message of specdec that spans several lines)."""


def say(msg: str, tool: str = "bench") -> None:
    print(f"[{tool} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def client(timeout_s: float = 30.0) -> httpx.Client:
    return httpx.Client(timeout=timeout_s, trust_env=False)  # never a proxy: the server is on this machine


class LocalServer:
    """One `specdec serve` subprocess; start() waits for GET /health, stop() ends it by its PID."""

    def __init__(self, label: str, serve_args: list[str], log_dir: Path):
        self.label, self.serve_args, self.log_path = label, serve_args, log_dir / f"{label}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float) -> None:
        for attempt in range(3):  # another process may take the free port between bind() and the server's bind
            self.port = free_port()
            cmd = self.command()
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.environment()}
            say(f"{self.label}: starting {' '.join(cmd[1:])}")
            with open(self.log_path, "wb") as log:  # its own process group: stop() ends its children too
                self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            t0 = time.perf_counter()
            if self._wait_healthy(t0 + timeout_s):
                self.startup_s = time.perf_counter() - t0
                say(f"{self.label}: healthy after {self.startup_s:.1f} s (pid {self.proc.pid}, port {self.port})")
                return
            code = self.proc.poll()
            if code is not None and "address already in use" in self.log_tail().lower() and attempt < 2:
                say(f"{self.label}: port {self.port} was taken; trying another")
                self.stop()  # what it started before it failed
                continue
            self.stop()
            why = (f"exited with status {code}" if code is not None
                   else f"did not answer GET /health within {timeout_s:g} s")
            raise BenchError(f"server '{self.label}' failed to start: it {why}.\n"
                             f"--- its output, last lines ({self.log_path}) ---\n{self.log_tail()}")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "specdec.cli", "serve", "--host", HOST, "--port", str(self.port),
                *self.serve_args]

    def environment(self) -> dict[str, str]:
        """What the server's environment adds to this process's."""
        return {}

    def _wait_healthy(self, deadline: float) -> bool:
        with client(2.0) as c:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if c.get(self.url + "/health").status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM by PID, then SIGKILL if it has not exited after timeout_s; then whatever of its process group is
        left (vLLM's engine and worker processes). Safe to call twice."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            say(f"{self.label}: stopping pid {self.proc.pid}")
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                say(f"{self.label}: no exit {timeout_s:g} s after SIGTERM; SIGKILL")
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def failed(self, e: Exception) -> BenchError:
        what = str(e) if isinstance(e, SpecdecError) else f"{type(e).__name__}: {e}"
        return BenchError(f"server '{self.label}': {what}\n--- its output, last lines ---\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.rstrip().splitlines()[-lines:]) or "(no output)"

    def problems(self) -> list[str]:
        """Tracebacks and warnings in the server's output (the engine thread prints a traceback when a step
        fails)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        keys = ("Traceback", "Error", "WARNING", "Warning")
        return [f"{self.label}: {line.strip()}" for line in text.splitlines() if any(k in line for k in keys)][:20]

    def metrics(self) -> dict[str, float]:
        """GET /metrics by series ('name{labels}')."""
        with client() as c:
            resp = c.get(self.url + "/metrics")
        if resp.status_code != 200:
            raise BenchError(f"server '{self.label}': GET /metrics answered HTTP {resp.status_code}")
        return prometheus_series(resp.text)

    def model(self) -> str:
        async def ask() -> str | None:
            async with httpx.AsyncClient(timeout=30.0, trust_env=False) as c:
                return await first_model(c, self.url + "/v1")

        try:
            name = run_async(ask())
        except RequestFailed as e:
            raise SpecdecError(f"GET /v1/models: {e}") from None
        if name is None:
            raise BenchError(f"server '{self.label}': GET /v1/models lists no model")
        return name


VLLM_VENV = ".venv-vllm"  # `make vllm`: vLLM's CPU build in a venv of its own, specdec installed there


def vllm_python(root: Path | None = None) -> Path:
    """The Python of `make vllm`'s venv (in the checkout at `root`, default this one's)."""
    root = root or Path(__file__).resolve().parents[3]
    return root / VLLM_VENV / "bin" / "python"


def cpu_range() -> str:
    """This process's CPUs as vLLM's VLLM_CPU_OMP_THREADS_BIND wants them: one range, the longest run of them."""
    cpus = sorted(os.sched_getaffinity(0))
    runs, start = [], cpus[0]
    for a, b in zip(cpus, cpus[1:] + [None]):
        if b != a + 1:
            runs.append((start, a))
            start = b
    lo, hi = max(runs, key=lambda r: r[1] - r[0])
    return f"{lo}-{hi}"


class VllmServer(LocalServer):
    """vLLM's OpenAI-compatible server (vllm-cpu, `make vllm`) on 127.0.0.1, with the life cycle of LocalServer.
    speculative: its --speculative-config (None: no speculation); proposer: $SPECDEC_VLLM for specdec's proposer
    (specdec/integrations/vllm.py); repair: $SPECDEC_VLLM_REPAIR=1, the repair of vLLM-CPU's speculative sampler for
    whatever method runs (integrations/vllm_repair.py). fp32 by default: in bf16 a verify pass over k + 1 rows
    rounds differently from a one-row step, and greedy outputs part at near-ties (docs/vllm.md)."""

    def __init__(self, label: str, model_dir: Path, log_dir: Path, speculative: dict | None = None,
                 proposer: dict | None = None, dtype: str = "float32", max_model_len: int = 4096,
                 python: Path | None = None, repair: bool = False):
        super().__init__(label, [], log_dir)
        self.model_dir, self.speculative, self.proposer, self.repair = model_dir, speculative, proposer, repair
        self.dtype, self.max_model_len = dtype, max_model_len
        self.python = python or vllm_python()

    def command(self) -> list[str]:
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", "smollm2", "--host", HOST, "--port", str(self.port), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--enforce-eager"]
        if self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        return cmd

    def environment(self) -> dict[str, str]:
        env = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or cpu_range(),
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",  # vLLM reports usage elsewhere unless told not to
               "PYTHONUNBUFFERED": "1"}
        if self.proposer is not None:
            env["SPECDEC_VLLM"] = json.dumps(self.proposer)
        if self.repair:
            env["SPECDEC_VLLM_REPAIR"] = "1"
        return env
