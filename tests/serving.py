"""`specdec serve` in a subprocess for the tests: a tiny word-level model to serve, the server bound to 127.0.0.1
on a free port and stopped by its process id, and small HTTP helpers. Request loops stay bounded in count and time.

A server is ready when `/health` answers 200: it loads its model and kernels before it listens. Kernels are built
by `make setup`; if a start still times out, the error gives the server's log and says whether a kernel build was
in progress (and whose)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import write_tiny_model, write_word_tokenizer

WORDS = ["<unk>", "<eos>", *[f"w{i}" for i in range(30)]]
KEY = "sekret"
CONTEXT = 128  # the tiny model's positions
PROMPTS = ["w1 w2 w3 w4 w5 w1 w2 w3", "w7 w8 w9", "w2 w2 w2 w2 w2 w2", "w10 w11 w12 w13 w10 w11",
           "w5", "w20 w21 w22 w23 w24 w25 w26 w27 w20 w21 w22"]
START_TIMEOUT_S = 90
# The tiny model's chat template: the messages' words, one message a line (a chat's prompt is its words).
JOIN_TEMPLATE = r"{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ '\n' }}{% endif %}{% endfor %}"


def write_served_model(folder: Path, context: int = CONTEXT, endless: bool = False,
                       chat_template: str | None = JOIN_TEMPLATE) -> Path:
    """The tiny model over WORDS in `folder`. endless: its end-of-sequence token is one it cannot produce (an id
    past its vocabulary), so a request holds its slot for all of its max_tokens. chat_template: its own (None:
    none, and chat requests get a 400)."""
    write_tiny_model(folder, vocab=len(WORDS), max_pos=context, std=0.3)
    write_word_tokenizer(folder, [*WORDS, "<never>"] if endless else WORDS)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if endless:
        config["eos_token"] = "<never>"
        (folder / "generation_config.json").unlink(missing_ok=True)  # transformers' default eos id is a word here
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kernel_build_note() -> str:
    """Whether a kernel build holds the cache's lock now, for a start that timed out."""
    from specdec.kernels import kernels_dir
    from specdec.kernels.build import read_holder

    holder = read_holder(kernels_dir())
    return f"{holder.describe()} was still running" if holder else "no kernel build was in progress"


class Server:
    """`specdec serve` in a subprocess on 127.0.0.1."""

    def __init__(self, model: Path, *args: str, timeout: float = START_TIMEOUT_S):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.log = open(model.parent / f"server-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--model", str(model), *args], stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    self.check_it_compiled_nothing()
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        note = kernel_build_note()
        self.stop()
        raise AssertionError(f"the server did not come up in {timeout:.0f} s ({note}):\n{self.output()}")

    def check_it_compiled_nothing(self) -> None:
        """`make setup` builds the kernels: a server start that compiles means it did not (or that the build's
        cache key moved), and every start on a fresh machine would pay for it."""
        if "compiling the native kernels" in self.output():
            self.stop()
            raise AssertionError("the server compiled the kernels at start-up: `make setup` (specdec kernels) should "
                                 f"have built them:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def client(self, key: str | None = KEY):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", timeout=60, max_retries=0)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def model_name(server: Server) -> str:
    return server.client().models.list().data[0].id


def post(server: Server, path: str, body, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    data = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=data, headers=headers, timeout=30)


def first_data(lines) -> str:
    for line in lines:
        if line.startswith("data:"):
            return line
    raise AssertionError("the stream ended without a data line")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
