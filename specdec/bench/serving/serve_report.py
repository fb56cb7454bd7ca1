"""The serving benchmark's report (`specdec loadtest --servers`): per prompt set a table of every policy at every
level with the server's own counters, the throughput ratios, the goals' PASS/FAIL lines and the chunked-prefill
table. Pure functions of the result dict that specdec.bench.serving.serve_bench writes as JSON."""

from __future__ import annotations

import os

from specdec.bench.tables import num

POLICIES = ("never", "always", "auto")
TOLERANCE_A = 0.03  # goal (a): auto may trail the better fixed policy by this fraction
SHARE_B = 0.9  # goal (b): the share of always's speedup auto must keep


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
                    num(r["draft_tokens_per_output_token"], 2), num(r["acceptance_rate"], 2),
                    num(r["mean_batch"], 1), num(r["loadavg_1m"], 1)]) + " |")
    lines += ["", "| concurrency | auto/never | auto/always | always/never |", "|---|---|---|---|"]
    for c, row in sorted(levels.items()):
        q = ratios(row)
        lines.append(f"| {c} | {num(q['auto/never'], 3)} | {num(q['auto/always'], 3)} | "
                     f"{num(q['always/never'], 3)} |")
    return "\n".join(lines) + "\n"


def prefill_table(pre: dict) -> str:
    lines = ["| prefill chunk | long prompt tokens | long TTFT p50 (ms) | streams through the window | "
             "gaps in window | gap p50 (ms) | gap p99 (ms) | gap max (ms) | gap p50 before (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    short = False
    for chunk, r in pre["runs"].items():
        tokens = {t["long_prompt_tokens"] for t in r["trials"]}
        through = [t.get("streams_through_window") for t in r["trials"]]
        short |= any(n is not None and n < len(t.get("stream_tokens", [])) for n, t in zip(through, r["trials"]))
        lines.append(f"| {'0 (whole prompt)' if chunk == '0' else chunk} | {', '.join(map(str, sorted(tokens)))} | "
                     f"{_ms(r['long_ttft_p50_s'])} | {', '.join('-' if n is None else str(n) for n in through)} | "
                     f"{r['window_gaps']} | {_ms(r['window_gap_p50_s'])} | {_ms(r['window_gap_p99_s'])} | "
                     f"{_ms(r['window_gap_max_s'])} | {_ms(r['gaps_before_p50_s'])} |")
    if short:
        lines.append("\nSome streams ended before the long prompt's first token (streams through the window, per "
                     "trial, of 4): their gaps are missing from the window, and where none lasted the trial measured "
                     "nothing. Raise `--prefill-stream-tokens`.")
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
