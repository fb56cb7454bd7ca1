"""The serving benchmark, in one run so that its ratios share one machine state: this machine's read bandwidth,
then `specdec serve` under `never`, `always` and `auto` (same model, n-gram drafter, k, max batch) driven by the
load generator of `specdec loadtest`, then the chunked-prefill experiment.

    .venv/bin/python scripts/serve_bench.py            # the full run: many minutes
    .venv/bin/python scripts/serve_bench.py --quick    # a smoke test: a few minutes, mostly server start-ups

Per policy, one server (127.0.0.1, a free port) serves two prompt sets, greedy and streamed:
  mixed  Spec-Bench first turns, a few each of coding, extraction, writing, translation, summarization and rag,
         at every --concurrency level;
  copy   copy-heavy: summarization and rag items plus the demo's code-edit prompt, at --copy-concurrency.
A level sends max(--requests-per-client, ceil(prompts / concurrency)) requests per client, so every level asks
every prompt of its set at least once (--no-cover: exactly --requests-per-client). Around each level the server's
/metrics is scraped; the deltas say how much the policy speculated there.

Goals, checked per level: (a) auto throughput >= max(never, always) - 3%; (b) on the copy set at concurrency 1,
auto keeps >= 90% of always's speedup over never: auto/never - 1 >= 0.9 * (always/never - 1).

Chunked prefill: a server with policy never and --max-batch 8, once with --prefill-chunk 64 (the default) and
once with 0 (whole prompts). Four clients stream long greedy answers; once all stream, one request with a
~1,500-token prompt arrives. Reported: the four streams' inter-chunk gaps that overlap the window from sending
the long request to its first token (p50, p99, max), and that request's time to first token.

Writes OUT/serve-bench.json, .md and .png (throughput and latency against concurrency, mixed set). Progress goes
to stderr; the report (tables and PASS/FAIL lines) to stdout. Exit status 0 when the measurement completed (also
when a goal fails; --strict makes a failed goal exit 1), 1 when a server did not start or a level failed.
Nothing connects anywhere but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

from specdec.atomic import write_text_atomic
from specdec.bench.profile import measure_bandwidth
from specdec.bench.prompts import load_prompts, select
from specdec.engine.demo import DEMO_PROMPT
from specdec.engine.scheduler import PREFILL_CHUNK
from specdec.errors import SpecdecError
from specdec.measure import percentile
from specdec.serve import loadtest
from specdec.serve.loadtest import LevelResult, LoadConfig

ROOT = Path(__file__).resolve().parents[1]

HOST = "127.0.0.1"
POLICIES = ("never", "always", "auto")
MIXED_CATEGORIES = ("coding", "extraction", "writing", "translation", "summarization", "rag")
COPY_CATEGORIES = ("summarization", "rag")
TOLERANCE_A = 0.03  # goal (a): auto may trail the better fixed policy by this fraction
SHARE_B = 0.9  # goal (b): the share of always's speedup auto must keep
COUNTERS = {  # per-level deltas scraped from /metrics
    "drafts": "specdec:spec_decode_num_drafts_total",
    "draft_tokens": "specdec:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "specdec:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "specdec:generation_tokens_total",
    "prompt_tokens": "specdec:prompt_tokens_total",
    "rounds": "specdec:batch_size_count",  # decode rounds
    "round_rows": "specdec:batch_size_sum",  # sequences over all rounds
}


class BenchError(Exception):
    """The benchmark cannot go on (a server did not start, a level failed); the message says why."""


def say(msg: str) -> None:
    print(f"[serve-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- servers ---------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def client(timeout_s: float = 30.0) -> httpx.Client:
    return httpx.Client(timeout=timeout_s, trust_env=False)  # never a proxy: the server is on this machine


class Server:
    """One `specdec serve` subprocess on 127.0.0.1; start() waits for GET /health, stop() ends it by its PID."""

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
            cmd = [sys.executable, "-m", "specdec.cli", "serve", "--host", HOST, "--port", str(self.port),
                   *self.serve_args]
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no downloads
            say(f"{self.label}: starting {' '.join(cmd[1:])}")
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT)
            t0 = time.perf_counter()
            if self._wait_healthy(t0 + timeout_s):
                self.startup_s = time.perf_counter() - t0
                say(f"{self.label}: healthy after {self.startup_s:.1f} s (pid {self.proc.pid}, port {self.port})")
                return
            code = self.proc.poll()
            if code is not None and "address already in use" in self.log_tail().lower() and attempt < 2:
                say(f"{self.label}: port {self.port} was taken; trying another")
                continue
            self.stop()
            why = (f"exited with status {code}" if code is not None
                   else f"did not answer GET /health within {timeout_s:g} s")
            raise BenchError(f"server '{self.label}' failed to start: it {why}.\n"
                             f"--- its output, last lines ({self.log_path}) ---\n{self.log_tail()}")

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
        """SIGTERM by PID, then SIGKILL if it has not exited after timeout_s. Safe to call twice."""
        if self.proc is None or self.proc.poll() is not None:
            return
        say(f"{self.label}: stopping pid {self.proc.pid}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            say(f"{self.label}: no exit {timeout_s:g} s after SIGTERM; SIGKILL")
            self.proc.kill()
            self.proc.wait()

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
        with client() as c:
            resp = c.get(self.url + "/metrics")
        if resp.status_code != 200:
            raise BenchError(f"server '{self.label}': GET /metrics answered HTTP {resp.status_code}")
        return parse_metrics(resp.text)

    def model(self) -> str:
        return asyncio.run(loadtest.resolve_model(LoadConfig(url=self.url, concurrency=(1,))))


def finite(obj):
    """obj with every NaN or infinity replaced by None (JSON has no NaN; a gauge without data reports one)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition text -> {'name{labels}': value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


# ---- prompts ---------------------------------------------------------------------------------------------------

def interleave(groups: list[list[str]]) -> list[str]:
    """Round-robin over the groups, so that any prefix of the list mixes categories."""
    out = []
    for i in range(max(map(len, groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def prompt_sets(path: str, per_category: int, copy_per_category: int) -> dict[str, list[str]]:
    items = load_prompts(path)

    def firsts(categories, n) -> list[list[str]]:
        chosen = select(items, categories, n)
        return [[p.turns[0] for p in chosen if p.category == c] for c in categories]

    return {"mixed": interleave(firsts(MIXED_CATEGORIES, per_category)),
            "copy": [DEMO_PROMPT] + interleave(firsts(COPY_CATEGORIES, copy_per_category))}


# ---- load levels -----------------------------------------------------------------------------------------------

def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict:
    d = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in COUNTERS.items()}
    ratio = lambda a, b: d[a] / d[b] if d[b] > 0 else None
    return {"counters": {k: int(round(v)) for k, v in d.items()},
            "acceptance_rate": ratio("accepted_tokens", "draft_tokens"),  # accepted / drafted tokens
            "draft_tokens_per_output_token": ratio("draft_tokens", "generation_tokens"),  # how much it speculated
            "drafting_share": ratio("drafts", "round_rows"),  # rows of a round that drafted >= 1 token
            "mean_accepted_per_draft": ratio("accepted_tokens", "drafts"),
            "mean_batch": ratio("round_rows", "rounds")}


def run_level(server: Server, model: str, prompts: list[str], c: int, args) -> dict:
    rpc = args.requests_per_client if args.no_cover else max(args.requests_per_client, math.ceil(len(prompts) / c))
    cfg = LoadConfig(url=server.url, concurrency=(c,), requests_per_client=rpc, max_tokens=args.max_tokens,
                     temperature=0.0, stream=True, model=model, timeout_s=args.request_timeout)
    before = server.metrics()
    r = asyncio.run(loadtest.run_level(cfg, prompts, c))
    spec = counter_deltas(before, server.metrics())
    return {**asdict(r), "requests_per_client": rpc, "loadavg_1m": os.getloadavg()[0], **spec}


def level_result(d: dict) -> LevelResult:
    return LevelResult(**{k: d[k] for k in LevelResult.__dataclass_fields__})


def warm_up(server: Server, model: str, sets: dict[str, list[str]]) -> None:
    """One short request per prompt set, so that the first level does not pay for first-call costs."""
    for prompts in sets.values():
        cfg = LoadConfig(url=server.url, concurrency=(1,), requests_per_client=1, max_tokens=8, temperature=0.0,
                         model=model, timeout_s=120.0)
        asyncio.run(loadtest.run_level(cfg, prompts[:1], 1))


def bench_policy(policy: str, sets: dict[str, list[str]], levels: dict[str, tuple[int, ...]], args,
                 log_dir: Path) -> dict:
    profile = ["--profile", args.auto_profile] if policy == "auto" and args.auto_profile else []
    server = Server(policy, ["--model", "default", "--drafter", "ngram", "--policy", policy, "--k", str(args.k),
                             "--max-batch", str(args.max_batch), *profile], log_dir)
    out: dict = {"sets": {}}
    try:
        server.start(args.startup_timeout)
        out["startup_s"] = server.startup_s
        model = server.model()
        say(f"{policy}: warm-up (one short request per prompt set)")
        warm_up(server, model, sets)
        for name, prompts in sets.items():
            out["sets"][name] = []
            for c in levels[name]:
                rec = run_level(server, model, prompts, c, args)
                out["sets"][name].append(rec)
                spec = rec["draft_tokens_per_output_token"]
                acc = rec["acceptance_rate"]
                say(f"{policy} {name} c={c}: {rec['requests'] - rec['failed']}/{rec['requests']} ok, "
                    f"{rec['throughput_tok_s']:.1f} tok/s, drafted/token {_num(spec, 2)}, accepted {_num(acc, 2)}")
        final = server.metrics()
        out["final_metrics"] = {k: v for k, v in final.items() if k.startswith("specdec:spec_decode")}
    except (SpecdecError, httpx.HTTPError) as e:  # every request of a level failed, or the server went away
        raise server.failed(e) from None
    finally:
        server.stop()
        out["server_problems"] = server.problems()
    return out


# ---- chunked prefill -------------------------------------------------------------------------------------------

def text_of(obj: dict) -> str:
    return "".join(ch.get("delta", {}).get("content") or "" for ch in obj.get("choices") or [])


async def timed_stream(c: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event | None = None) -> dict:
    """One streamed request: the perf_counter time of each text chunk, and its usage."""
    t0, times, usage = time.perf_counter(), [], None
    async with c.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise BenchError(f"POST {url}: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("error"):
                raise BenchError(f"POST {url}: stream error {obj['error']}")
            if text_of(obj):
                times.append(time.perf_counter())
                if started is not None:
                    started.set()
            usage = obj.get("usage") or usage
    if started is not None:
        started.set()  # a stream that ended without text must not hang the wait
    return {"t0": t0, "times": times, "t_end": time.perf_counter(), "usage": usage}


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def prompt_tokens(server: Server, model: str, prompt: str) -> int:
    """usage.prompt_tokens the server reports for one chat message (a 1-token request; it also warms up)."""
    with client(300.0) as c:
        resp = c.post(server.url + "/v1/chat/completions", json=chat_body(model, prompt, 1, stream=False))
    if resp.status_code != 200:
        raise BenchError(f"server '{server.label}': HTTP {resp.status_code}: {resp.text[:300]}")
    return int(resp.json()["usage"]["prompt_tokens"])


def long_prompt(source: str, chars: int, tag: str) -> str:
    """A unique first line (no two requests share a prefix), Spec-Bench text cut to `chars`, an instruction."""
    return f"[{tag}]\n{source[:chars]}\n\nSummarize the text above in a few sentences."


def fit_long_prompt(server: Server, model: str, source: str, target: int) -> tuple[int, int]:
    """The number of source characters whose prompt is about `target` tokens, by the server's count."""
    chars = min(len(source), target * 4)
    tokens = prompt_tokens(server, model, long_prompt(source, chars, "fit 0"))
    for i in range(1, 4):
        if abs(tokens - target) <= 0.02 * target or (chars == len(source) and tokens < target):
            break
        chars = min(len(source), int(chars * target / tokens))
        tokens = prompt_tokens(server, model, long_prompt(source, chars, f"fit {i}"))
    return chars, tokens


async def prefill_trial(server: Server, model: str, long_text: str, background: list[str], args) -> dict:
    url = server.url + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=len(background) + 1)
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits, trust_env=False) as c:
        started = [asyncio.Event() for _ in background]
        streams = [asyncio.create_task(timed_stream(c, url, chat_body(model, p, args.prefill_stream_tokens), ev))
                   for p, ev in zip(background, started)]
        try:
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 300)
            await asyncio.sleep(args.prefill_delay)
            t_send = time.perf_counter()
            long = await timed_stream(c, url, chat_body(model, long_text, 4))
            bg = await asyncio.gather(*streams)
        finally:
            for t in streams:
                t.cancel()
    if not long["times"]:
        raise BenchError(f"server '{server.label}': the long request streamed no text")
    t_first = long["times"][0]
    window, before = [], []
    for s in bg:
        for a, b in zip(s["times"], s["times"][1:]):
            if b > t_send and a < t_first:  # the gap overlaps [send, first token]
                window.append(b - a)
            elif b <= t_send:
                before.append(b - a)
    return {"long_prompt_tokens": (long["usage"] or {}).get("prompt_tokens"),
            "long_ttft_s": t_first - t_send, "window_s": t_first - t_send, "window_gaps_s": window,
            "gaps_before_p50_s": percentile(before, 50),
            "streams_through_window": sum(bool(s["times"]) and s["times"][-1] >= t_first for s in bg),
            "stream_tokens": [(s["usage"] or {}).get("completion_tokens") for s in bg]}


def bench_prefill(texts: list[str], background: list[str], args, log_dir: Path) -> dict:
    source = "\n\n".join(texts)  # Spec-Bench summarization and rag first turns
    out: dict = {"target_prompt_tokens": args.long_prompt_tokens, "runs": {}}
    chars = None
    for chunk in (PREFILL_CHUNK, 0):
        label = f"prefill-chunk-{chunk}"
        server = Server(label, ["--model", "default", "--policy", "never", "--max-batch", "8",
                                "--prefill-chunk", str(chunk)], log_dir)
        try:
            server.start(args.startup_timeout)
            model = server.model()
            if chars is None:
                chars, tokens = fit_long_prompt(server, model, source, args.long_prompt_tokens)
                out["long_prompt_chars"] = chars
                say(f"long prompt: {chars} characters, {tokens} tokens by the server's count")
            else:
                prompt_tokens(server, model, long_prompt(source, chars, "warm-up"))  # the same warm-up
            trials = []
            for rep in range(args.prefill_reps):
                t = asyncio.run(prefill_trial(server, model, long_prompt(source, chars, f"{label} #{rep}"),
                                              background, args))
                trials.append(t)
                say(f"{label} #{rep}: long TTFT {t['long_ttft_s'] * 1e3:.0f} ms, {len(t['window_gaps_s'])} gaps "
                    f"in the window, max {_ms(max(t['window_gaps_s'], default=None))} ms, "
                    f"{t['streams_through_window']}/{len(background)} streams ran through it")
            gaps = [g for t in trials for g in t["window_gaps_s"]]
            ttfts = [t["long_ttft_s"] for t in trials]
            out["runs"][str(chunk)] = {
                "prefill_chunk": chunk, "trials": trials, "long_ttft_p50_s": percentile(ttfts, 50),
                "long_ttft_max_s": max(ttfts), "window_gaps": len(gaps),
                "window_gap_p50_s": percentile(gaps, 50), "window_gap_p99_s": percentile(gaps, 99),
                "window_gap_max_s": max(gaps, default=None),
                "gaps_before_p50_s": percentile([t["gaps_before_p50_s"] for t in trials
                                                 if t["gaps_before_p50_s"] is not None], 50)}
        except (SpecdecError, httpx.HTTPError) as e:
            raise server.failed(e) from None
        finally:
            server.stop()
            out.setdefault("server_problems", []).extend(server.problems())
    return out


# ---- report ----------------------------------------------------------------------------------------------------

def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def by_level(policies: dict, set_name: str) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for policy, res in policies.items():
        for rec in res["sets"].get(set_name, []):
            out.setdefault(rec["concurrency"], {})[policy] = rec
    return out


def ratios(row: dict[str, dict]) -> dict[str, float | None]:
    tp = {p: r["throughput_tok_s"] for p, r in row.items()}
    div = lambda a, b: tp[a] / tp[b] if a in tp and b in tp and tp[b] > 0 else None
    return {"auto/never": div("auto", "never"), "auto/always": div("auto", "always"),
            "always/never": div("always", "never")}


def goals(policies: dict) -> list[dict]:
    out = []
    for set_name in ("mixed", "copy"):
        for c, row in sorted(by_level(policies, set_name).items()):
            if not all(p in row for p in POLICIES):
                continue
            tp = {p: row[p]["throughput_tok_s"] for p in POLICIES}
            failed = sum(row[p]["failed"] for p in POLICIES)
            best = max(tp["never"], tp["always"])
            bar = (1 - TOLERANCE_A) * best
            out.append({"goal": "a", "set": set_name, "concurrency": c, "pass": tp["auto"] >= bar,
                        "failed_requests": failed,
                        "line": f"(a) {set_name} c={c}: auto {tp['auto']:.1f} tok/s vs max(never {tp['never']:.1f}, "
                                f"always {tp['always']:.1f}) - 3% = {bar:.1f} tok/s (auto/best {tp['auto'] / best:.3f})"
                                if best > 0 else f"(a) {set_name} c={c}: no throughput"})
            if set_name == "copy" and c == 1 and tp["never"] > 0:
                s_auto, s_always = tp["auto"] / tp["never"] - 1, tp["always"] / tp["never"] - 1
                note = "" if s_always > 0 else " (always is no faster than never here: the goal is vacuous)"
                out.append({"goal": "b", "set": set_name, "concurrency": c, "pass": s_auto >= SHARE_B * s_always,
                            "failed_requests": failed,
                            "line": f"(b) copy c=1: auto/never - 1 = {s_auto:+.3f} vs {SHARE_B} x (always/never - 1)"
                                    f" = {SHARE_B * s_always:+.3f}{note}"})
    return out


def goal_lines(checks: list[dict]) -> list[str]:
    return [("PASS " if g["pass"] else "FAIL ") + g["line"]
            + (f" [{g['failed_requests']} requests failed]" if g["failed_requests"] else "") for g in checks]


def set_tables(policies: dict, set_name: str) -> str:
    head = ["concurrency", "policy", "requests", "failed", "tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
            "ITL p50 (ms)", "ITL p99 (ms)", "drafted / output token", "acceptance", "mean batch", "load 1m"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    levels = by_level(policies, set_name)
    for c, row in sorted(levels.items()):
        for p in POLICIES:
            if p in row:
                r = row[p]
                lines.append("| " + " | ".join([
                    str(c), p, str(r["requests"]), str(r["failed"]), f"{r['throughput_tok_s']:.1f}",
                    _ms(r["ttft_p50_s"]), _ms(r["ttft_p99_s"]), _ms(r["itl_p50_s"]), _ms(r["itl_p99_s"]),
                    _num(r["draft_tokens_per_output_token"], 2), _num(r["acceptance_rate"], 2),
                    _num(r["mean_batch"], 1), _num(r["loadavg_1m"], 1)]) + " |")
    lines += ["", "| concurrency | auto/never | auto/always | always/never |", "|---|---|---|---|"]
    for c, row in sorted(levels.items()):
        q = ratios(row)
        lines.append(f"| {c} | {_num(q['auto/never'], 3)} | {_num(q['auto/always'], 3)} | "
                     f"{_num(q['always/never'], 3)} |")
    return "\n".join(lines) + "\n"


def prefill_table(pre: dict) -> str:
    lines = ["| prefill chunk | long prompt tokens | long TTFT p50 (ms) | gaps in window | gap p50 (ms) | "
             "gap p99 (ms) | gap max (ms) | gap p50 before (ms) |", "|---|---|---|---|---|---|---|---|"]
    for chunk, r in pre["runs"].items():
        tokens = {t["long_prompt_tokens"] for t in r["trials"]}
        lines.append(f"| {'0 (whole prompt)' if chunk == '0' else chunk} | {', '.join(map(str, sorted(tokens)))} | "
                     f"{_ms(r['long_ttft_p50_s'])} | {r['window_gaps']} | {_ms(r['window_gap_p50_s'])} | "
                     f"{_ms(r['window_gap_p99_s'])} | {_ms(r['window_gap_max_s'])} | {_ms(r['gaps_before_p50_s'])} |")
    return "\n".join(lines) + "\n"


def report(result: dict) -> str:
    cfg, bw = result["config"], result["bandwidth"]
    parts = [
        "# Serving benchmark: policies never / always / auto\n",
        f"Machine: {os.cpu_count()} CPUs, read bandwidth {bw['read_GBps']:.1f} GB/s (best {bw['read_GBps_best']:.1f}),"
        f" copy {bw['copy_GBps']:.1f} GB/s; load average {result['loadavg_start'][0]:.2f} at the start, "
        f"{result['loadavg_end'][0]:.2f} at the end.\n",
        f"Servers: SmolLM2-135M (`default`), n-gram drafter, k = {cfg['k']}, max batch {cfg['max_batch']}; greedy, "
        f"streamed, {cfg['max_tokens']} tokens per request. ITL is the gap between streamed chunks (a speculative "
        "round may send several tokens in one chunk). `drafted / output token`, `acceptance` and `mean batch` are "
        "deltas of the server's /metrics over the level; `load 1m` is the machine's 1-minute load average after it "
        "(this run's own server and clients included: compare it between policies).\n",
        "Start-up (to GET /health): " + ", ".join(f"{p} {r['startup_s']:.0f} s" for p, r in result["policies"].items())
        + "; the auto policy's pass costs: "
        + (f"`{cfg['auto_profile']}`.\n" if cfg["auto_profile"] else "calibrated by the server at start-up.\n"),
    ]
    for name, prompts in result["prompt_sets"].items():
        parts += [f"## Prompt set `{name}` ({len(prompts)} prompts)\n", set_tables(result["policies"], name)]
    parts += ["## Goals\n", "```", *goal_lines(result["goals"]), "```\n"]
    if result.get("prefill"):
        pre = result["prefill"]
        parts += ["## Chunked prefill (policy never, max batch 8)\n",
                  f"Four streams of {cfg['prefill_stream_tokens']} greedy tokens; {cfg['prefill_delay']:g} s after "
                  f"all stream, one request with a ~{pre['target_prompt_tokens']}-token prompt. Gaps: the streams' "
                  "inter-chunk gaps that overlap [long request sent, its first token]; "
                  f"{cfg['prefill_reps']} trial(s) per server, pooled.\n", prefill_table(pre)]
    problems = [p for r in result["policies"].values() for p in r.get("server_problems", [])]
    problems += (result.get("prefill") or {}).get("server_problems", [])
    if problems:
        parts += ["## Server output worth a look\n", "```", *problems, "```\n"]
    return "\n".join(parts)


# ---- main ------------------------------------------------------------------------------------------------------

def parse_levels(text: str, flag: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise SystemExit(f"serve_bench: {flag} must be comma-separated integers >= 1, got {text!r}")
    return levels


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default=str(ROOT.parent / "shared/data/spec_bench/question.jsonl"),
                   help="Spec-Bench question.jsonl")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="levels for the mixed set")
    p.add_argument("--copy-concurrency", default="1,4", help="levels for the copy set")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--no-cover", action="store_true",
                   help="send exactly --requests-per-client per client (default: enough to ask every prompt)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--per-category", type=int, default=2, help="mixed set: items per category")
    p.add_argument("--copy-per-category", type=int, default=3, help="copy set: summarization and rag items each")
    p.add_argument("--policies", default=",".join(POLICIES), help="a subset, for debugging")
    p.add_argument("--auto-profile", metavar="FILE",
                   help="`specdec profile` JSON for the auto server's pass costs (default: it calibrates at start-up, "
                        "under whatever load the machine has then)")
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for GET /health")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--long-prompt-tokens", type=int, default=1500)
    p.add_argument("--prefill-stream-tokens", type=int, default=200)
    p.add_argument("--prefill-delay", type=float, default=1.5, help="seconds after all four stream")
    p.add_argument("--prefill-reps", type=int, default=3)
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--out-dir", default=str(ROOT / "artifacts"))
    p.add_argument("--quick", action="store_true",
                   help="smoke test: concurrency 1,2 (copy 1), 1 request per client, 16 tokens, one small prefill "
                        "trial")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = p.parse_args(argv)
    if args.quick:
        args.concurrency, args.copy_concurrency = "1,2", "1"
        args.requests_per_client, args.max_tokens, args.per_category, args.copy_per_category = 1, 16, 1, 1
        args.prefill_stream_tokens, args.prefill_reps = 64, 1
    args.levels = {"mixed": parse_levels(args.concurrency, "--concurrency"),
                   "copy": parse_levels(args.copy_concurrency, "--copy-concurrency")}
    args.policy_list = [x.strip() for x in args.policies.split(",") if x.strip()]
    if not args.policy_list or not set(args.policy_list) <= set(POLICIES):
        raise SystemExit(f"serve_bench: --policies must name some of {', '.join(POLICIES)}")
    if min(args.requests_per_client, args.max_tokens, args.k, args.max_batch, args.prefill_reps) < 1:
        raise SystemExit("serve_bench: counts (requests, tokens, k, batch, reps) must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers
    sets = prompt_sets(args.prompts, args.per_category, args.copy_per_category)
    config = {k: v for k, v in vars(args).items() if k not in ("levels", "policy_list")}
    result: dict = {"config": config, "loadavg_start": os.getloadavg(),
                    "prompt_sets": sets, "levels": args.levels, "policies": {}}
    say("measuring read bandwidth (1 GiB, 5 reps)")
    bw = measure_bandwidth(1 << 30, 5)
    result["bandwidth"] = bw
    print(f"read bandwidth: {bw['read_GBps']:.2f} GB/s (best {bw['read_GBps_best']:.2f}), copy "
          f"{bw['copy_GBps']:.2f} GB/s", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="serve-bench-logs-"))  # the servers' output; kept when a step fails
    try:
        for policy in args.policy_list:
            result["policies"][policy] = bench_policy(policy, sets, args.levels, args, logs)
        if not args.skip_prefill:
            items = load_prompts(args.prompts)
            source = [p.turns[0] for p in select(items, ["summarization", "rag"])]
            background = [p.turns[0] for p in select(items, ["writing"], 4)]
            result["prefill"] = bench_prefill(source, background, args, logs)
    except BenchError as e:
        partial = out_dir / "serve-bench.partial.json"
        write_text_atomic(partial, json.dumps(finite(result), indent=1, allow_nan=False))
        print(f"serve_bench: error: {e}\n(partial results: {partial}; server logs: {logs})", file=sys.stderr)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    result["goals"] = goals(result["policies"])
    text = report(result)
    write_text_atomic(out_dir / "serve-bench.md", text)
    write_text_atomic(out_dir / "serve-bench.json", json.dumps(finite(result), indent=1, allow_nan=False))
    series = {p: [level_result(r) for r in res["sets"]["mixed"]] for p, res in result["policies"].items()}
    loadtest.plot_series(series, out_dir / "serve-bench.png")
    print(text)
    say(f"wrote {out_dir / 'serve-bench.json'}, .md, .png")
    return 1 if args.strict and not all(g["pass"] for g in result["goals"]) else 0


if __name__ == "__main__":
    sys.exit(main())
