"""Two `specdec serve` processes on one machine (slow: the bundled model). Each sizes its thread team from its CPUs
and gives threads back while the other computes (specdec/kernels/cores.py); when one is killed mid-load, the other
answers every request with the text it gives alone. Request loops are bounded in count and time; both servers bind
127.0.0.1 and are stopped by their process ids."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.serving import Server, post

pytestmark = pytest.mark.slow

SERVE = ("--model", "default", "--max-batch", "4", "--context", "1024")
PROMPTS = ["List the planets of the solar system in order.", "Repeat after me: the cat sat on the mat. The cat",
           "Write a haiku about autumn leaves.", "What is 12 times 12? Answer and explain."]
BODY = {"model": "SmolLM2-135M-Instruct", "max_tokens": 40, "temperature": 0}
ROUNDS = 3  # requests per prompt per server under load


def ask(server: Server, prompt: str) -> tuple[int, str]:
    try:
        r = post(server, "/v1/completions", {"prompt": prompt, **BODY}, key=None)
    except Exception as e:  # the killed server's clients: connections refused or cut
        return -1, repr(e)
    return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text


def test_a_server_keeps_its_answers_when_its_neighbour_is_killed_mid_load(tmp_path):
    a = Server(tmp_path / "a", *SERVE)
    b = None
    try:
        alone = {p: ask(a, p) for p in PROMPTS}
        assert all(code == 200 for code, _ in alone.values()), alone
        assert "threads: 2 (affinity" in a.output() or "threads: 1 (affinity" in a.output(), a.output()
        b = Server(tmp_path / "b", *SERVE)
        jobs = [(s, p) for _ in range(ROUNDS) for p in PROMPTS for s in (a, b)]
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(ask, s, p) for s, p in jobs]
            # kill b once it has answered a request, while a has requests in flight and queued
            next(f for f, (s, _) in zip(futures, jobs) if s is b).result(timeout=300)
            b.proc.send_signal(signal.SIGKILL)
            results = [(s, p, f.result(timeout=300)) for f, (s, p) in zip(futures, jobs)]
        assert b.proc.wait(30) == -signal.SIGKILL
        for s, p, (code, text) in results:
            if s is a:
                assert code == 200 and text == alone[p][1], (p, code, text, a.output())
        assert a.health()["status"] == "ok"
        assert ask(a, PROMPTS[0]) == alone[PROMPTS[0]]
    finally:
        if b is not None:
            b.stop()
        assert a.stop() == 0, a.output()
