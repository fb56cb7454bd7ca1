"""The engine's speed on the thread that loaded the model against a second thread, side by side in one process.

The kernels' OpenMP team belongs to the thread that first ran a pass; a pass on another thread starts a second team,
and with more OpenMP threads alive than cores libgomp's barriers sleep instead of spinning. This measures what that
costs: one-row passes and the step loop (the server's engine: 4 Spec-Bench chat prompts, policy auto, n-gram,
128 tokens each), alternating between the main thread and a fresh second thread (which exits after each run, so
its team does not outlive it).

    .venv/bin/python scripts/thread_bench.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.hardware.profile import measure_bandwidth  # noqa: E402
from specdec.engine.calibrate import make_policy, planned_cost  # noqa: E402
from specdec.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from specdec.engine.sequence import GenerationConfig  # noqa: E402
from specdec.engine.speculation import Speculation  # noqa: E402
from specdec.provenance import cpu_name, git_revision  # noqa: E402
from specdec.runtime import ModelSpec, build  # noqa: E402

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared/data/spec_bench/question.jsonl"


def on_thread(fn, second: bool):
    """fn() on this thread, or on a fresh thread that exits afterwards."""
    if not second:
        return fn()
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    args = ap.parse_args()
    target, drafter = build(ModelSpec(args.model, "ngram", None, None, None, "cpu", 4, 1, None))
    model, tok = target.model, target.tokenizer
    how = Speculation("auto", 5)
    policy = make_policy(how, planned_cost(target, how, args.requests), drafter.free)
    sched = Scheduler(model, tok, drafter, policy, SchedulerConfig(args.requests, 64, 2048))
    questions = [json.loads(line)["turns"][0] for line in SPEC_BENCH.open()][::40][: args.requests]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in questions]
    cache = model.new_cache(1, 1024)
    model.forward(torch.arange(200)[None], torch.tensor([0]), cache, last_only=torch.tensor([199]), prefill=True)

    def passes() -> float:  # median ms of a one-row pass at position 200
        times = []
        for _ in range(60):
            t0 = time.perf_counter()
            model.forward_ragged(torch.tensor([7]), torch.tensor([0]), torch.tensor([200]), cache)
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times[10:])

    def steps() -> float:  # tokens per second of the step loop over the prompts
        for p in prompts:
            sched.admit(sched.new_sequence(p, GenerationConfig(128)))
        t0, tokens = time.perf_counter(), 0
        while not sched.idle:
            tokens += sum(len(e.tokens) for e in sched.step())
        return tokens / (time.perf_counter() - t0)

    steps()  # warm-up: the policy's first rounds, the kernels' buffers
    bw = measure_bandwidth(1 << 30, 5)["read_GBps"]
    cpu, rev = cpu_name(), git_revision(Path(__file__).resolve().parents[1])
    print(f"{cpu}, {torch.get_num_threads()} threads, {model.precision}; read bandwidth {bw:.1f} GB/s (torch sum "
          f"over 1 GiB, median of 5); git {rev}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    ratios = []
    for rep in range(args.reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        got = {second: (on_thread(passes, second), on_thread(steps, second)) for second in order}
        (pm, sm), (pt, st) = got[False], got[True]
        ratios.append(sm / st)
        print(f"rep {rep}: one-row pass {pm:.2f} ms on the loading thread, {pt:.2f} ms on a second ({pt / pm:.2f}x); "
              f"step loop {sm:.0f} tok/s against {st:.0f} tok/s ({sm / st:.2f}x)", flush=True)
    print(f"step loop, loading thread over second thread: {', '.join(f'{r:.2f}x' for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
