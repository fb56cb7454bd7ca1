"""The same prompts through llama.cpp on the same GGUF file: plain greedy decoding and llama.cpp's own prompt
lookup, as extra bench methods measured against our plain decoding.

llama.cpp runs through node-llama-cpp's prebuilt CPU build, which is not a dependency of specdec: it is found in
$NODE_LLAMA_DIR (default /tmp/llamacpp) and driven by one long-lived node process, llamacpp_worker.mjs (next to
this file; it documents the JSON-lines protocol). The model loads once; each generation is one request. The
prompt goes as our token ids, so both sides prefill exactly the same tokens (multi-turn prompts follow each
method's own answers, as for Hugging Face). llama.cpp computes with its own kernels on the GGUF's own
(quantized) weights, so its output is not expected to equal ours: the report shows that identity as information,
not as a check of specdec.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import shutil
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.results import Result
from specdec.bench.runner import Method, Turn
from specdec.errors import SpecdecError

FAMILY = "llama.cpp"
WORKER = Path(__file__).with_name("llamacpp_worker.mjs")
DEFAULT_DIR = "/tmp/llamacpp"
VERSION = "3.22.1"  # the node-llama-cpp release this was written and measured against
INSTALL = (f"mkdir -p {DEFAULT_DIR} && cd {DEFAULT_DIR} && npm init -y && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true "
           f"npm install --no-audit --no-fund node-llama-cpp@{VERSION}")
LOAD_TIMEOUT_S = 300.0  # loading the model and the warm-up token
QUIT_GRACE_S = 5.0  # how long close() waits for the worker to exit on its own before killing it


def llama_dir() -> Path:
    return Path(os.environ.get("NODE_LLAMA_DIR") or DEFAULT_DIR).expanduser()


def gguf_path(model: str | None) -> Path:
    """The GGUF file llama.cpp runs: the bundled one for --model default, else --model itself."""
    from specdec.models.gguf.convert import bundled_gguf_path

    if model in ("default", "", None):
        return bundled_gguf_path()
    path = Path(model).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise SpecdecError(f"--compare llama.cpp runs llama.cpp on the same GGUF file: --model must be 'default' or a "
                           f".gguf file, not {model}")
    return path


def worker_command(gguf: Path, threads: int, node: str | None = None, directory: Path | None = None) -> list[str]:
    """The command that starts the worker; a SpecdecError saying how to install what is missing."""
    node = node or shutil.which("node")
    directory = directory or llama_dir()
    if not node or not Path(node).is_file():
        raise SpecdecError("--compare llama.cpp needs Node.js (`node` on PATH, version 20 or later) and "
                           f"node-llama-cpp in $NODE_LLAMA_DIR (default {DEFAULT_DIR}); install it with: {INSTALL}")
    if not (directory / "node_modules" / "node-llama-cpp" / "package.json").is_file():
        raise SpecdecError(f"--compare llama.cpp needs node-llama-cpp in {directory} ($NODE_LLAMA_DIR, default "
                           f"{DEFAULT_DIR}); install it with: {INSTALL}")
    return [node, str(WORKER), "--model", str(gguf), "--threads", str(threads)]


class LlamaCppWorker:
    """One worker process: requests answered in order, each within timeout_s. Any failure of the worker (it exits,
    stalls, or answers out of protocol) stops it and raises SpecdecError; an error it reports for one request
    raises SpecdecError and leaves it running. close() stops it; so does the end of this process (atexit), and
    the worker exits by itself when its stdin closes, should this process be killed."""

    def __init__(self, command: list[str], env: dict | None = None, timeout_s: float = 300.0,
                 load_timeout_s: float = LOAD_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._next_id = 0
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        try:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
                                         env={**os.environ, "NODE_LLAMA_DIR": str(llama_dir()), **(env or {})})
        except OSError as e:
            raise SpecdecError(f"cannot start the llama.cpp worker ({e})") from None
        self._pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True),
                       threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True)]
        for t in self._pumps:
            t.start()
        atexit.register(self.close)
        ready = self._read(load_timeout_s, "loading the model")
        if not ready.get("ready"):
            self.close()
            raise SpecdecError(f"the llama.cpp worker could not start: {ready.get('error', 'no reason given')}")
        self.info = {k: v for k, v in ready.items() if k != "ready"}

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line.rstrip("\n"))
        put(None)  # end of stream (the stderr deque keeps it as a harmless None)

    def _tail(self) -> str:
        lines = [x for x in self._stderr if x]
        return ("; its last words on stderr: " + " | ".join(lines[-5:])) if lines else ""

    def _fail(self, message: str, kill: bool = False):
        code = self.close(kill)
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        raise SpecdecError(f"llama.cpp worker: {message} ({how}; stopped){self._tail()}")

    def _read(self, timeout: float, what: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self._fail(f"no answer within {timeout:g} s while {what}", kill=True)
        if line is None:
            self._fail(f"exited while {what}")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            self._fail(f"sent a line that is not a JSON object while {what}: {line[:120]!r}", kill=True)
        return obj

    def request(self, **payload) -> dict:
        if self.proc.poll() is not None:
            self._fail("is not running")
        self._next_id += 1
        rid = self._next_id
        try:
            self.proc.stdin.write(json.dumps({"id": rid, **payload}) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._fail(f"exited before request {rid}")
        reply = self._read(self.timeout_s, f"answering request {rid}")
        if reply.get("id") != rid:
            self._fail(f"answered request {reply.get('id')!r} when {rid} was asked", kill=True)
        if not reply.get("ok"):
            raise SpecdecError(f"llama.cpp worker: request {rid} failed: {reply.get('error', 'no reason given')}")
        return reply

    def close(self, kill: bool = False) -> int | None:
        """Stop the worker (ask it to quit, kill it if it does not); its exit status. Safe to call again."""
        if self.proc.poll() is None:
            if not kill:
                try:
                    self.proc.stdin.write('{"op": "quit"}\n')
                    self.proc.stdin.flush()
                except (OSError, ValueError):
                    pass
            try:
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(0 if kill else QUIT_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._pumps:  # its last words on stderr, read to the end
            t.join(1.0)
        atexit.unregister(self.close)
        return self.proc.returncode


def turn_from_reply(ids: list[int], reply: dict, tokenizer) -> Turn:
    """A worker's answer as a Turn; the text decoded by our tokenizer (as for Hugging Face), so that a next turn
    is encoded the same way for every method."""
    try:
        tokens = [int(t) for t in reply["tokens"]]
        times = [float(t) for t in reply["token_times"]]
        seconds = float(reply["seconds"])
        ttft = seconds if reply["ttft_s"] is None else float(reply["ttft_s"])
        finish, prompt_tokens = reply["finish"], int(reply["prompt_tokens"])
        drafted, accepted = reply.get("drafted"), reply.get("accepted")
    except (KeyError, TypeError, ValueError) as e:
        raise SpecdecError(f"llama.cpp worker: malformed answer ({type(e).__name__}: {e})") from None
    if len(times) != len(tokens) or finish not in ("eos", "length"):
        raise SpecdecError(f"llama.cpp worker: malformed answer ({len(tokens)} tokens, {len(times)} times, "
                           f"finish {finish!r})")
    if prompt_tokens != len(ids):
        raise SpecdecError(f"llama.cpp worker: prefilled {prompt_tokens} tokens where {len(ids)} were sent")
    return Turn(list(ids), tokens, tokenizer.decode(tokens), finish, seconds, ttft, times,
                drafted=None if drafted is None else int(drafted), accepted=None if accepted is None else int(accepted))


def llamacpp_method(name: str, worker: LlamaCppWorker, tokenizer, baseline: str | None, k: int | None = None,
                    ngram_min: int = 1, ngram_max: int = 4) -> Method:
    """Greedy decoding of our prompt token ids by llama.cpp; with prompt lookup of up to k tokens when k is given
    (patterns of ngram_min..ngram_max tokens, matched in the prompt)."""

    def generate(ids: list[int], max_new_tokens: int) -> Turn:
        payload = {"tokens": list(ids), "max_tokens": max_new_tokens, "lookup": k is not None}
        if k is not None:
            payload.update(k=k, ngram_min=ngram_min, ngram_max=ngram_max)
        return turn_from_reply(ids, worker.request(**payload), tokenizer)

    return Method(name, generate, FAMILY, baseline, k)


def llamacpp_methods(worker: LlamaCppWorker, tokenizer, k: int, ngram_min: int, ngram_max: int,
                     baseline: str = "plain") -> tuple[list[Method], dict]:
    """(llama.cpp plain and llama.cpp prompt lookup with k tokens, both served by `worker` and measured against
    `baseline`; what the report's configuration records about them)."""
    info = {**worker.info, "k": k, "ngram_min": ngram_min, "ngram_max": ngram_max, "timeout_s": worker.timeout_s}
    methods = [llamacpp_method(f"{FAMILY} plain", worker, tokenizer, baseline),
               llamacpp_method(f"{FAMILY} lookup k={k}", worker, tokenizer, baseline, k, ngram_min, ngram_max)]
    return methods, info


@dataclass
class ChatTiming(Result):
    """One user message through llama.cpp (timed_chat)."""

    prompt_tokens: int
    ttft_s: float | None  # prefill + 1 token
    decode_tok_s: float | None  # (new tokens - 1) / (last token - first token)
    new_tokens: int
    wall_s: float | None
    load_s: float | None  # the worker's load, not timed in the rest
    threads: int | None
    chat: bool
    lookup: bool  # node-llama-cpp's prompt lookup at its defaults
    stopped_on_eog: bool
    text: str
    drafted: int | None = None
    accepted: int | None = None
    predictions: dict[str, int] | None = None  # runs before 2026-12-04: node-llama-cpp's own lookup counters


@dataclass
class PlainAndLookup(Result):
    plain: ChatTiming
    lookup: ChatTiming


def timed_chat(worker: LlamaCppWorker, text: str, max_tokens: int, lookup: bool = False) -> ChatTiming:
    """One user message through the GGUF's own chat template, greedy, from an empty KV cache: time to first token
    (prefill + 1 token) and the decode rate after it, (new tokens - 1) / (last token - first token). With lookup,
    node-llama-cpp's prompt lookup at its defaults (k 3). The model's load and warm-up are not timed."""
    r = worker.request(messages=[{"role": "user", "content": text}], max_tokens=max_tokens, lookup=lookup)
    n, ttft, last = len(r["tokens"]), r["ttft_s"], r.get("last_token_s")
    decode_s = last - ttft if n > 1 and last is not None and ttft is not None else 0.0
    return ChatTiming(prompt_tokens=r["prompt_tokens"], ttft_s=ttft,
                      decode_tok_s=(n - 1) / decode_s if decode_s > 0 else None, new_tokens=n,
                      wall_s=last if last is not None else ttft, load_s=worker.info.get("load_s"),
                      threads=worker.info.get("threads"), chat=True, lookup=lookup,
                      stopped_on_eog=r["finish"] == "eos", text=r["text"], drafted=r.get("drafted"),
                      accepted=r.get("accepted"))


def plain_and_lookup(gguf: Path, text: str, max_tokens: int, threads: int, say=print) -> PlainAndLookup | None:
    """llama.cpp on one GGUF and one user message, plain and with its prompt lookup; None (and a line said) when
    node-llama-cpp is not installed or the worker fails."""
    try:
        worker = LlamaCppWorker(worker_command(gguf, threads), timeout_s=900.0)
    except SpecdecError as e:
        say(f"llama.cpp: skipped ({e})")
        return None
    try:
        return PlainAndLookup(timed_chat(worker, text, max_tokens), timed_chat(worker, text, max_tokens, True))
    except SpecdecError as e:
        say(f"llama.cpp failed: {e}")
        return None
    finally:
        worker.close()
