"""specdec beside other specdec processes: servers loaded at once against one alone, and a quota-limited process
against a taskset-pinned one, side by side in one run (issue 48).

servers: N `specdec serve --policy never` on 127.0.0.1 (the bundled model), each driven by 4 clients sending 3
greedy requests of 64 tokens in turn (Spec-Bench first turns), as `specdec loadtest --concurrency 4` does; one
server loaded alone, then 2 and 3 loaded at the same time, each rep. With `--base DIR` (a checkout of another
revision, e.g. `git worktree add /tmp/base HEAD~3`) the same servers run that tree's code too, the two trees'
reps alternated, so that "before" and "after" share the machine's state.

audit: the README's `specdec audit` on one host: an exact n-gram server (--policy always) and a lossy one
(--lossy-typical-acceptance), each against a `--drafter none` reference, all three up at once. Beside each audit,
the same audit of each of its two servers against itself, with the other idle: one process then does both halves
of the work, so its time is twice what that server's half takes alone; "within 2x of each server alone" is the
pair's time at most the larger of the two self-audits.

alone: one process on an idle machine: decode tok/s of `specdec generate --drafter none` and the verify curve (the
median pass of 1-9 rows after 256 cached tokens, 20 reps, as `specdec profile` times them), each tree's run
alternated with the other's: sharing must cost a process alone nothing (goal: within 3%).

quota: `specdec generate --drafter none` (256 tokens) pinned to one CPU with taskset, against the same command in
a cgroup whose CPU quota is one CPU (written here: cgroup v2's cpu.max or v1's cpu.cfs_quota_us; needs root).

    .venv/bin/python scripts/share_bench.py --reps 2 --base /tmp/base --markdown docs/results/sharing.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.serving.load_types import LoadConfig  # noqa: E402
from specdec.bench.serving.loadtest import run_level  # noqa: E402
from specdec.bench.serving.servers import LocalServer, say  # noqa: E402
from specdec.provenance import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared/data/spec_bench/question.jsonl"
CGROUP_NAME = f"specdec-share-bench-{os.getpid()}"


def prompts(path: Path, n: int = 40) -> list[str]:
    first = [json.loads(line)["turns"][0] for line in path.open()]
    return first[:: max(1, len(first) // n)][:n]


async def load(servers: list[LocalServer], texts: list[str], clients: int, per_client: int, max_tokens: int):
    """Every server driven at once; tokens/s of each."""
    cfgs = [LoadConfig(s.url, (clients,), per_client, max_tokens, timeout_s=600) for s in servers]
    levels = await asyncio.gather(*(run_level(c, texts, clients) for c in cfgs))
    return [lv.output_tokens / lv.wall_s for lv in levels]


def with_tree(tree: Path | None):
    """Environment of a process that runs `tree`'s specdec (None: this one)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def team_of(server: LocalServer) -> str | None:
    """The server's thread team and others' CPU use when the load ended (GET /health; None on older servers)."""
    import httpx

    h = httpx.get(server.url + "/health", timeout=10, trust_env=False).json()
    if "threads" not in h:
        return None
    metrics = httpx.get(server.url + "/metrics", timeout=10, trust_env=False).text
    others = next((line.split()[-1] for line in metrics.splitlines()
                   if line.startswith("specdec:cpu_used_by_others ")), "?")
    return f"{h['threads']} ({float(others):.2f} CPUs others)" if others != "?" else str(h["threads"])


def start_all(servers: list[LocalServer], tree: Path | None) -> None:
    """Start `servers` on `tree`'s code (their subprocesses inherit this process's environment)."""
    old = os.environ.get("PYTHONPATH")
    os.environ.update(with_tree(tree))
    try:
        for s in servers:
            s.start(300)
    finally:
        os.environ.pop("PYTHONPATH", None) if old is None else os.environ.update(PYTHONPATH=old)


def servers_arm(tree: Path | None, label: str, texts, args, log_dir: Path) -> dict[str, list[float]]:
    """One rep of one tree: tok/s of server 0 alone, then of each server with 2 and 3 loaded at once."""
    servers = [LocalServer(f"{label}-{i}", ["--policy", "never", *args.serve_args.split()], log_dir)
               for i in range(max(args.counts))]
    try:
        start_all(servers, tree)
        asyncio.run(load(servers[:1], texts[:4], 1, 1, 16))  # warm-up: first requests map the KV pool
        out = {}
        for n in sorted(args.counts):
            tps = asyncio.run(load(servers[:n], texts, args.clients, args.per_client, args.max_tokens))
            out[str(n)] = tps
            teams = [team_of(s) for s in servers[:n]]
            out[f"{n} teams"] = teams
            say(f"{label}: {n} server(s) at once: " + ", ".join(f"{t:.1f}" for t in tps) + f" tok/s; teams at the "
                f"end {teams}", "share")
        return out
    finally:
        for s in servers:
            s.stop()


AUDIT_SERVE = ["--k", "4", "--max-batch", "8"]


def audit_time(endpoint: LocalServer, reference: LocalServer, tree: Path | None, samples: int) -> dict:
    cmd = [sys.executable, "-m", "specdec.cli", "audit", "--endpoint", endpoint.url, "--reference", reference.url,
           "--samples", str(samples), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=with_tree(tree), capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    try:
        verdict = json.loads(r.stdout)["verdict"]
    except (ValueError, KeyError):
        verdict = f"failed ({r.returncode}): {r.stderr.strip()[-300:]}"
    return {"seconds": wall, "verdict": verdict}


def audit_arm(tree: Path | None, label: str, args, log_dir: Path) -> dict[str, dict]:
    """Times of the exact and the lossy audit, and of each server's self-audit, all three servers up."""
    servers = {"reference": ["--drafter", "none"], "exact": ["--policy", "always", "--drafter", "ngram"],
               "lossy": ["--policy", "always", "--drafter", "ngram", "--lossy-typical-acceptance"]}
    servers = {k: LocalServer(f"{label}-{k}", AUDIT_SERVE + v, log_dir) for k, v in servers.items()}
    try:
        start_all(list(servers.values()), tree)
        out = {}
        for a, b in (("exact", "reference"), ("lossy", "reference"), ("exact", "exact"), ("lossy", "lossy"),
                     ("reference", "reference")):
            out[f"{a} vs {b}"] = audit_time(servers[a], servers[b], tree, args.samples)
            say(f"{label}: audit {a} vs {b}: {out[f'{a} vs {b}']}", "share")
        return out
    finally:
        for s in servers.values():
            s.stop()


CURVE = """
import json, statistics, sys
from specdec.models.timing import time_passes
from specdec.runtime import ModelSpec, build
target, _ = build(ModelSpec("default", "none"))
t = time_passes(target.model, 256, list(range(1, 10)), 20)
print(json.dumps({n: statistics.median(v) for n, v in t.items()}))
"""


def alone_arm(tree: Path | None, text: str, args) -> dict:
    r = subprocess.run([sys.executable, "-c", CURVE], env=with_tree(tree), capture_output=True, text=True,
                       timeout=600, cwd=tree or ROOT)
    if r.returncode != 0:
        raise SystemExit(f"the verify curve failed: {r.stderr[-2000:]}")
    return {"decode": generate([], tree, text, None, args.new_tokens)["tok_s"],
            "pass_s": {int(n): v for n, v in json.loads(r.stdout).items()}}


def make_cgroup(cpus: float) -> Path:
    """A cgroup whose CPU quota is `cpus` CPUs: cgroup v2 where it is mounted with the cpu controller, else v1."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists():
        folder = v2 / CGROUP_NAME
        folder.mkdir()
        (folder / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
        return folder
    folder = v2 / "cpu" / CGROUP_NAME
    folder.mkdir()
    (folder / "cpu.cfs_period_us").write_text("100000")
    (folder / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    return folder


def generate(prefix: list[str], tree: Path | None, text: str, cgroup: Path | None, new_tokens: int) -> dict:
    cmd = [*prefix, sys.executable, "-m", "specdec.cli", "generate", "--drafter", "none", "--max-new-tokens",
           str(new_tokens), "--prompt", text, "--json"]
    join = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup is not None else None
    r = subprocess.run(cmd, env=with_tree(tree), capture_output=True, text=True, preexec_fn=join, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"generate failed: {r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    team = next((line for line in r.stderr.splitlines() if "threads:" in line), "(no threads line)")
    decode_s = j["total_s"] - j["ttft_s"]
    return {"tok_s": (j["generated_tokens"] - 1) / decode_s, "threads": team.strip()}


def quota_arm(tree: Path | None, text: str, args) -> dict[str, dict]:
    cg = make_cgroup(1.0)
    try:
        return {"taskset -c 0": generate(["taskset", "-c", "0"], tree, text, None, args.new_tokens),
                "quota 1 CPU": generate([], tree, text, cg, args.new_tokens)}
    finally:
        with contextlib.suppress(OSError):
            cg.rmdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--base", type=Path, help="another checkout whose specdec runs beside this one's")
    ap.add_argument("--counts", default="1,2,3", help="servers loaded at once, one level each (1 is alone)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=400, help="audit: completions per prompt per server")
    ap.add_argument("--new-tokens", type=int, default=256, help="quota: tokens generated")
    ap.add_argument("--serve-args", default="", help="more arguments for every server")
    ap.add_argument("--skip", default="", help="alone,servers,audit,quota: parts not to run")
    ap.add_argument("--prompts", type=Path, default=SPEC_BENCH)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.counts = [int(c) for c in args.counts.split(",")]
    texts = prompts(args.prompts)
    trees = [("after", None)] + ([("before", args.base.resolve())] if args.base else [])
    prov = provenance(bandwidth=True)
    say(f"{prov['cpu']}, bandwidth {prov['bandwidth_gbs']} GB/s, git {prov['git']}", "share")
    result: dict = {"provenance": prov, "servers": {t: [] for t, _ in trees}, "quota": {t: [] for t, _ in trees},
                    "audit": {t: [] for t, _ in trees}, "alone": {t: [] for t, _ in trees}}
    with tempfile.TemporaryDirectory() as logs:
        for rep in range(args.reps):
            order = trees if rep % 2 == 0 else trees[::-1]
            for label, tree in order:
                if "servers" not in args.skip:
                    result["servers"][label].append(servers_arm(tree, f"{label}-r{rep}", texts, args, Path(logs)))
                if "alone" not in args.skip:
                    a = alone_arm(tree, texts[0], args)
                    result["alone"][label].append(a)
                    say(f"{label}: decode {a['decode']:.1f} tok/s; passes of 1-9 rows (ms) "
                        + " ".join(f"{1e3 * v:.2f}" for v in a["pass_s"].values()), "share")
                if "audit" not in args.skip:
                    result["audit"][label].append(audit_arm(tree, f"{label}-r{rep}", args, Path(logs)))
                if "quota" not in args.skip:
                    q = quota_arm(tree, texts[0], args)
                    result["quota"][label].append(q)
                    say(f"{label}: " + "; ".join(f"{k}: {v['tok_s']:.1f} tok/s ({v['threads']})"
                                                 for k, v in q.items()), "share")
    print(report(result, args.counts))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def report(result: dict, counts: list[int]) -> str:
    lines = []
    for label, reps in result["servers"].items():
        for i, rep in enumerate(reps):
            alone = rep["1"][0]
            parts = [f"alone {alone:.1f} tok/s"]
            for n in counts[1:]:
                tps = rep[str(n)]
                parts.append(f"{n} at once: " + ", ".join(f"{t:.1f}" for t in tps) + " tok/s (each "
                             + ", ".join(f"{t / alone:.0%}" for t in tps) + " of alone)")
            lines.append(f"servers {label} rep {i}: " + "; ".join(parts))
    for label, reps in result["quota"].items():
        for i, q in enumerate(reps):
            pin, quota = q["taskset -c 0"]["tok_s"], q["quota 1 CPU"]["tok_s"]
            lines.append(f"quota {label} rep {i}: taskset {pin:.1f} tok/s, quota {quota:.1f} tok/s "
                         f"({quota / pin:.0%} of pinned); {q['quota 1 CPU']['threads']}")
    for label, reps in result["audit"].items():
        for i, a in enumerate(reps):
            for kind in ("exact", "lossy"):
                pair = a[f"{kind} vs reference"]
                alone = max(a[f"{kind} vs {kind}"]["seconds"], a["reference vs reference"]["seconds"])
                lines.append(f"audit {label} rep {i}: {kind} vs reference {pair['seconds']:.0f} s "
                             f"({pair['verdict']}); the larger self-audit {alone:.0f} s (2x one server alone): "
                             f"{pair['seconds'] / alone:.2f} of the bound")
    alone = result["alone"]
    if all(alone.get(k) for k in ("after", "before")):
        dec = {k: statistics.median(a["decode"] for a in alone[k]) for k in ("after", "before")}
        curve = {k: {n: statistics.median(a["pass_s"][n] for a in alone[k]) for n in alone[k][0]["pass_s"]}
                 for k in ("after", "before")}
        lines.append(f"alone, after/before: decode {dec['after'] / dec['before']:.3f}; pass of n rows "
                     + " ".join(f"{n}: {curve['after'][n] / curve['before'][n]:.3f}" for n in curve["after"]))
    medians = {label: statistics.median(r["1"][0] for r in reps) for label, reps in result["servers"].items() if reps}
    if len(medians) == 2:
        lines.append(f"one server alone, after/before: {medians['after'] / medians['before']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
