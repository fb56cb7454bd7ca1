"""The serving benchmark's report (`specdec loadtest --servers`): per prompt set a table of every policy at every
level with the server's own counters, the throughput ratios, the goals' PASS/FAIL lines and the chunked-prefill
table. Pure functions of the typed result (ServeBenchRun, defined here) that specdec.bench.serving.serve_bench writes
as JSON."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from specdec.bench.results import Result
from specdec.bench.serving.load_types import LevelResult
from specdec.bench.tables import num

POLICIES = ("never", "always", "auto")
TOLERANCE_A = 0.03  # goal (a): auto may trail the better fixed policy by this fraction
SHARE_B = 0.9  # goal (b): the share of always's speedup auto must keep


@dataclass
class ServeLevel(LevelResult):
    """One level of one prompt set against one server: the load test's summary and the server's own counters
    over it (serve_bench.counter_deltas)."""

    requests_per_client: int = 1
    loadavg_1m: float | None = None  # the machine's 1-minute load average after the level
    counters: dict[str, int] = field(default_factory=dict)  # deltas of the server's /metrics
    acceptance_rate: float | None = None  # accepted / drafted tokens
    draft_tokens_per_output_token: float | None = None  # how much it speculated
    drafting_share: float | None = None  # rows of a round that drafted >= 1 token
    mean_accepted_per_draft: float | None = None
    mean_batch: float | None = None


@dataclass
class PolicyRun:
    """One server (policy never, always or auto): its levels per prompt set."""

    sets: dict[str, list[ServeLevel]] = field(default_factory=dict)
    startup_s: float | None = None  # to GET /health
    final_metrics: dict[str, float | None] = field(default_factory=dict)  # its spec_decode counters at the end
    server_problems: list[str] = field(default_factory=list)


@dataclass
class Goal:
    goal: str  # "a": auto within 3% of the better fixed policy; "b": auto keeps 90% of always's speedup
    set: str
    concurrency: int
    passed: bool = field(metadata={"json": "pass"})
    failed_requests: int
    line: str


@dataclass
class PrefillTrial:
    """Four streams, then one long prompt (prefill_bench.prefill_trial)."""

    long_prompt_tokens: int | None  # usage.prompt_tokens, where the server sends usage
    long_ttft_s: float
    window_s: float  # [long request sent, its first token]
    window_gaps_s: list[float]  # the streams' inter-chunk gaps that overlap the window
    gaps_before_p50_s: float | None
    streams_through_window: int | None
    stream_tokens: list[int]


@dataclass
class PrefillChunkRun:
    """One server's trials at one prefill chunk (0: the whole prompt at once)."""

    prefill_chunk: int
    trials: list[PrefillTrial]
    long_ttft_p50_s: float | None
    long_ttft_max_s: float
    window_gaps: int
    window_gap_p50_s: float | None
    window_gap_p99_s: float | None
    window_gap_max_s: float | None
    gaps_before_p50_s: float | None


@dataclass
class PrefillRun:
    target_prompt_tokens: int
    runs: dict[str, PrefillChunkRun] = field(default_factory=dict)  # by chunk, as a string
    long_prompt_chars: int | None = None
    server_problems: list[str] = field(default_factory=list)


@dataclass
class ServeBenchRun(Result):
    """`specdec loadtest --servers`: serve-bench.json."""

    config: dict
    loadavg_start: list[float]
    prompt_sets: dict[str, list[str]]
    levels: dict[str, list[int]]
    policies: dict[str, PolicyRun] = field(default_factory=dict)
    bandwidth: dict = field(default_factory=dict)  # bench.hardware.profile.measure_bandwidth
    prefill: PrefillRun | None = None
    loadavg_end: list[float] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    machine: dict = field(default_factory=dict)



def by_level(policies: dict[str, PolicyRun], set_name: str) -> dict[int, dict[str, ServeLevel]]:
    out: dict[int, dict[str, ServeLevel]] = {}
    for policy, res in policies.items():
        for rec in res.sets.get(set_name, []):
            out.setdefault(rec.concurrency, {})[policy] = rec
    return out


def ratios(row: dict[str, ServeLevel]) -> dict[str, float | None]:
    tp = {p: r.throughput_tok_s for p, r in row.items()}
    div = lambda a, b: tp[a] / tp[b] if a in tp and b in tp and tp[b] > 0 else None
    return {"auto/never": div("auto", "never"), "auto/always": div("auto", "always"),
            "always/never": div("always", "never")}


def goals(policies: dict[str, PolicyRun]) -> list[Goal]:
    out = []
    for set_name in ("mixed", "copy"):
        for c, row in sorted(by_level(policies, set_name).items()):
            if not all(p in row for p in POLICIES):
                continue
            tp = {p: row[p].throughput_tok_s for p in POLICIES}
            failed = sum(row[p].failed for p in POLICIES)
            best = max(tp["never"], tp["always"])
            bar = (1 - TOLERANCE_A) * best
            out.append(Goal("a", set_name, c, tp["auto"] >= bar, failed,
                            f"(a) {set_name} c={c}: auto {tp['auto']:.1f} tok/s vs max(never {tp['never']:.1f}, "
                            f"always {tp['always']:.1f}) - 3% = {bar:.1f} tok/s (auto/best {tp['auto'] / best:.3f})"
                            if best > 0 else f"(a) {set_name} c={c}: no throughput"))
            if set_name == "copy" and c == 1 and tp["never"] > 0:
                s_auto, s_always = tp["auto"] / tp["never"] - 1, tp["always"] / tp["never"] - 1
                note = "" if s_always > 0 else " (always is no faster than never here: the goal is vacuous)"
                out.append(Goal("b", set_name, c, s_auto >= SHARE_B * s_always, failed,
                                f"(b) copy c=1: auto/never - 1 = {s_auto:+.3f} vs {SHARE_B} x (always/never - 1)"
                                f" = {SHARE_B * s_always:+.3f}{note}"))
    return out


def goal_lines(checks: list[Goal]) -> list[str]:
    return [("PASS " if g.passed else "FAIL ") + g.line
            + (f" [{g.failed_requests} requests failed]" if g.failed_requests else "") for g in checks]


def set_tables(policies: dict[str, PolicyRun], set_name: str) -> str:
    head = ["concurrency", "policy", "requests", "failed", "tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
            "ITL p50 (ms)", "ITL p99 (ms)", "drafted / output token", "acceptance", "mean batch", "load 1m"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    levels = by_level(policies, set_name)
    for c, row in sorted(levels.items()):
        for p in POLICIES:
            if p in row:
                r = row[p]
                lines.append("| " + " | ".join([
                    str(c), p, str(r.requests), str(r.failed), f"{r.throughput_tok_s:.1f}",
                    *(num(v, 1, 1e3) for v in (r.ttft_p50_s, r.ttft_p99_s, r.itl_p50_s, r.itl_p99_s)),
                    num(r.draft_tokens_per_output_token, 2), num(r.acceptance_rate, 2),
                    num(r.mean_batch, 1), num(r.loadavg_1m, 1)]) + " |")
    lines += ["", "| concurrency | auto/never | auto/always | always/never |", "|---|---|---|---|"]
    for c, row in sorted(levels.items()):
        q = ratios(row)
        lines.append(f"| {c} | {num(q['auto/never'], 3)} | {num(q['auto/always'], 3)} | "
                     f"{num(q['always/never'], 3)} |")
    return "\n".join(lines) + "\n"


def prefill_table(pre: PrefillRun) -> str:
    lines = ["| prefill chunk | long prompt tokens | long TTFT p50 (ms) | streams through the window | "
             "gaps in window | gap p50 (ms) | gap p99 (ms) | gap max (ms) | gap p50 before (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    short = False
    for chunk, r in pre.runs.items():
        tokens = {t.long_prompt_tokens for t in r.trials}
        through = [t.streams_through_window for t in r.trials]
        short |= any(n is not None and n < len(t.stream_tokens) for n, t in zip(through, r.trials))
        gaps = [num(v, 1, 1e3) for v in (r.window_gap_p50_s, r.window_gap_p99_s, r.window_gap_max_s,
                                          r.gaps_before_p50_s)]
        lines.append(f"| {'0 (whole prompt)' if chunk == '0' else chunk} | {', '.join(map(str, sorted(tokens)))} | "
                     f"{num(r.long_ttft_p50_s, 1, 1e3)} | {', '.join('-' if n is None else str(n) for n in through)} | "
                     f"{r.window_gaps} | " + " | ".join(gaps) + " |")
    if short:
        lines.append("\nSome streams ended before the long prompt's first token (streams through the window, per "
                     "trial, of 4): their gaps are missing from the window, and where none lasted the trial measured "
                     "nothing. Raise `--prefill-stream-tokens`.")
    return "\n".join(lines) + "\n"


def report(result: ServeBenchRun) -> str:
    cfg, bw = result.config, result.bandwidth
    parts = [
        "# Serving benchmark: policies never / always / auto\n",
        f"Machine: {os.cpu_count()} CPUs, read bandwidth {bw['read_GBps']:.1f} GB/s (best {bw['read_GBps_best']:.1f}),"
        f" copy {bw['copy_GBps']:.1f} GB/s; load average {result.loadavg_start[0]:.2f} at the start, "
        f"{result.loadavg_end[0]:.2f} at the end.\n",
        f"Servers: SmolLM2-135M (`default`), n-gram drafter, k = {cfg['k']}, max batch {cfg['max_batch']}; greedy, "
        f"streamed, {cfg['max_tokens']} tokens per request. ITL is the gap between streamed chunks (a speculative "
        "round may send several tokens in one chunk). `drafted / output token`, `acceptance` and `mean batch` are "
        "deltas of the server's /metrics over the level; `load 1m` is the machine's 1-minute load average after it "
        "(this run's own server and clients included: compare it between policies).\n",
        "Start-up (to GET /health): " + ", ".join(f"{p} {r.startup_s:.0f} s" for p, r in result.policies.items())
        + "; the auto policy's pass costs: "
        + (f"`{cfg['auto_profile']}`.\n" if cfg["auto_profile"] else "calibrated by the server at start-up.\n"),
    ]
    for name, prompts in result.prompt_sets.items():
        parts += [f"## Prompt set `{name}` ({len(prompts)} prompts)\n", set_tables(result.policies, name)]
    parts += ["## Goals\n", "```", *goal_lines(result.goals), "```\n"]
    if result.prefill:
        pre = result.prefill
        parts += ["## Chunked prefill (policy never, max batch 8)\n",
                  f"Four streams of {cfg['prefill_stream_tokens']} greedy tokens; {cfg['prefill_delay']:g} s after "
                  f"all stream, one request with a ~{pre.target_prompt_tokens}-token prompt. Gaps: the streams' "
                  "inter-chunk gaps that overlap [long request sent, its first token]; "
                  f"{cfg['prefill_reps']} trial(s) per server, pooled.\n", prefill_table(pre)]
    problems = [p for r in result.policies.values() for p in r.server_problems]
    problems += result.prefill.server_problems if result.prefill else []
    if problems:
        parts += ["## Server output worth a look\n", "```", *problems, "```\n"]
    return "\n".join(parts)
