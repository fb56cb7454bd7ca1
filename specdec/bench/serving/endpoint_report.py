"""The Markdown of `specdec bench --endpoint`: the Spec-Bench tables per level (specdec.bench.render), then each
level's load figures (specdec.bench.serving.loadtest_report) and the acceptance the servers exposed. The run itself is
specdec.bench.serving.endpoint; `bench`'s command line (specdec.bench.cli) calls both."""

from __future__ import annotations

from specdec.bench import render, tables
from specdec.bench.serving.load_types import LevelResult
from specdec.bench.serving.loadtest_report import markdown_series
from specdec.measure import acceptance


def markdown(report) -> str:
    """The endpoint report: the Spec-Bench tables per level, then each level's load figures and acceptance."""
    cfg, ep = report.config, report.endpoint
    servers = ", ".join(f"{k} {v['url']} (model {v['model']})" for k, v in ep["servers"].items())
    out = [f"# specdec bench --endpoint: {cfg['prompts']} prompts, {cfg['max_new_tokens']} new tokens, greedy, "
           f"concurrency {', '.join(map(str, cfg['concurrency']))}", "", f"Servers: {servers}. Prompts from "
           f"{cfg['prompt_file']}; streamed chat completions (the server's chat template). Speedup = mean tokens/s "
           "of a request over the baseline's on the same prompts at the same concurrency (prefill included).", ""]
    if any(m["baseline"] for m in report.methods):
        out += ["## Speedup per category and concurrency (Spec-Bench layout)", "", render.leaderboard(report), ""]
    out += ["## Details", "", "Tokens/chunk: completion tokens per streamed chunk after the first (a speculative "
            "server sends a verified run at once). ITL: gaps between chunks. a: from the server's counters "
            "(per request at concurrency 1) or its per-response timings.", "", render.details(report), "",
            "## Load per level", "", markdown_series(
                {f"{k} c={lv['concurrency']}": [LevelResult(**lv[k]["load"])]
                 for lv in ep["levels"] for k in ep["servers"]}), "", "## Throughput and acceptance per level", ""]
    for lv in ep["levels"]:
        if "baseline" in lv:
            tput = lv["endpoint"]["load"]["throughput_tok_s"], lv["baseline"]["load"]["throughput_tok_s"]
            out.append(f"- c={lv['concurrency']}: throughput {tput[0]:.1f} against {tput[1]:.1f} tok/s: "
                       f"{tables.speedup(tput[0] / tput[1] if tput[1] else None)} (all requests of the level, prefill "
                       "included)")
        for k in ep["servers"]:
            c, g = lv[k]["counters"], lv[k]["gauges"]
            if c:
                a = acceptance(c["accepted"], c["drafted"])
                out.append(f"- {k} c={lv['concurrency']}: counters: {c['drafted']} drafted, {c['accepted']} accepted "
                           f"(a = {tables.num(a, 3)}), {c['drafts']} drafts")
            if g:
                out.append(f"- {k} c={lv['concurrency']}: gauges after the run: "
                           + ", ".join(f"{n} = {v:.3f}" for n, v in g.items()))
            if not c and not g:
                out.append(f"- {k} c={lv['concurrency']}: no acceptance counters or gauges at /metrics")
    rc = ep.get("round_cost")
    if rc and "why" in rc:
        out += ["", f"No round cost at concurrency 1 (so no `verify_cost` for `specdec plan --profile`): {rc['why']}."]
    elif rc:
        out += ["", f"Round cost at concurrency 1: a drafting round over {rc['rows']} rows (drafting included; "
                f"{rc['drafting_rounds']} of {rc['passes']} passes drafted) takes {rc['round_s'] * 1e3:.1f} ms "
                f"against {rc['plain_step_s'] * 1e3:.1f} ms per plain step: {rc['cost']:.2f} passes. The JSON holds "
                "it as `verify_cost` for `specdec plan --profile`."
                + (f" Note: {rc['note']}." if rc.get("note") else "")]
    return "\n".join(out + render.checks_section(report)) + "\n"
