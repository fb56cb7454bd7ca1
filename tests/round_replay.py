"""Recorded rounds, replayed: the choices the step loop and the vLLM proposer make on fixed scenarios, so that a
change to how a round is decided and learned (engine/round.py) can be shown to change none of them.

Each scenario runs with a deterministic clock (every time.perf_counter() call advances it by one millisecond), so
the automatic policy learns the same pass costs on every run. `python -m tests.round_replay` writes what the code
of the day chooses to tests/data/round_replay.json; tests/test_round_replay.py replays it and compares.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from specdec.drafters.base import Draft, Drafter, pad_rows

RECORD = Path(__file__).parent / "data" / "round_replay.json"


@contextmanager
def fixed_clock(step: float = 1e-3):
    """time.perf_counter, for every caller, as a counter that advances `step` a call."""
    real, now = time.perf_counter, [0.0]

    def tick() -> float:
        now[0] += step
        return now[0]

    time.perf_counter = tick
    try:
        yield
    finally:
        time.perf_counter = real


class Scripted(Drafter):
    """A deterministic drafter of every kind the round knows: free (a lookup: offers all the room), planned (asked
    for what the plan wants), or confident (with a confidence per token, at temperature 0). It drafts the target's
    own greedy continuation of the context (the plain loop written out, conftest.greedy_reference), turned off
    course at a position that depends on the context: drafts accepted for 0 to k tokens, as a real drafter's are."""

    def __init__(self, kind: str, model):
        self.kind, self.model = kind, model
        self.free, self.confident = kind == "free", kind == "confident"
        self.name = f"scripted-{kind}"

    def propose(self, slots, contexts, ks):
        from tests.conftest import greedy_reference

        width = max(ks, default=0)
        rows, conf = [], []
        for ctx, k in zip(contexts, ks):
            good = greedy_reference(self.model, list(ctx), k) if k else []
            off = (sum(ctx[-3:]) + len(ctx)) % (k + 2)  # the first position drafted wrong (k + 1: none)
            rows.append([t if i < off else (t + 1) % self.model.cfg.vocab_size for i, t in enumerate(good)])
            conf.append([0.95 if i < off else 0.3 for i in range(width)])
        confidence = torch.tensor(conf, dtype=torch.float32).reshape(len(ks), width) if self.confident else None
        return Draft(pad_rows(rows, width), confidence=confidence)


def scheduler_rounds(model, tokenizer, drafter, policy, prompts, temperature: float, new_tokens: int) -> list:
    """Per decode round: each row's drafts verified and accepted, as the step loop chose them."""
    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.engine.sequence import GenerationConfig
    from specdec.sampling.warp import SamplingConfig

    rounds = []
    with fixed_clock():
        sched = Scheduler(model, tokenizer, drafter, policy,
                          SchedulerConfig(max_batch=len(prompts), max_queue=None, context=128, prefill_chunk=None))
        sched.on_round = lambda r: rounds.append([list(r.drafted), list(r.accepted)])
        cfg = GenerationConfig(new_tokens, SamplingConfig(temperature, 0, 1.0, 7))
        for i, p in enumerate(prompts):
            sched.admit(sched.new_sequence(list(p), cfg, rid=i))
        while not sched.idle:
            sched.step()
    return rounds


def scheduler_scenarios(targets: dict, tokenizer) -> dict:
    """targets: "lookup", a tiny model whose greedy text repeats (prompt lookup's drafts are accepted there), and
    "scripted", a peakier one (sampled drafts are accepted there too)."""
    from specdec.drafters.ngram import NgramDrafter
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.engine.calibrate import make_policy
    from specdec.engine.policy import PassCost
    from specdec.engine.speculation import Speculation

    curve = PassCost(((1, 1e-3), (2, 1.05e-3), (4, 1.2e-3), (8, 1.6e-3), (16, 2.6e-3)))
    scripted = targets["scripted"]
    out = {}
    for name, target, make in (
            ("ngram", targets["lookup"], NgramDrafter), ("suffix", targets["lookup"], SuffixDrafter),
            ("free", scripted, lambda: Scripted("free", scripted)),
            ("planned", scripted, lambda: Scripted("planned", scripted)),
            ("confident", scripted, lambda: Scripted("confident", scripted))):
        vocab = target.cfg.vocab_size
        prompts = [[(i * 5 + j * 3) % vocab for j in range(12)] * 2 for i in range(3)]  # repeated: lookups match
        for temperature in (0.0, 0.5):
            for policy in ("auto", "fixed"):
                drafter = make()
                pol = make_policy(Speculation(policy, 4 if policy == "fixed" else 6), curve, drafter.free)
                out[f"{name} t={temperature:g} {policy}"] = scheduler_rounds(target, tokenizer, drafter, pol, prompts,
                                                                             temperature, 24)
    return out


def vllm_scenarios() -> dict:
    """The drafts the vLLM proposer hands vLLM, step by step, on tests/test_vllm_proposer.py's simulated batch."""
    from tests.test_vllm_proposer import make, prompt

    out = {}
    for drafter in ("ngram", "suffix"):
        for policy in ("auto", "fixed"):
            p, b = make(policy=policy, drafter=drafter, cost=lambda w: 0.01 + 0.0004 * max(0, w - 4))
            steps, rid = [], 0
            for step in range(60):
                if step % 4 == 0 and rid < 8:
                    b.add(prompt(rid, 6 + 7 * (rid % 3)), budget=30 + 9 * (rid % 4) + 6 + 7 * (rid % 3), rid=rid)
                    rid += 1
                b.step()
                steps.append([list(r["draft"]) for r in b.rows])
            out[f"vllm {drafter} {policy}"] = steps
    return out


def record(targets: dict, tokenizer) -> dict:
    return {"scheduler": scheduler_scenarios(targets, tokenizer), "vllm": vllm_scenarios()}


def tiny_targets() -> dict:
    """The targets of the scheduler scenarios: conftest's tiny Llama (vocab 64) at two weight scales, fp32."""
    import tempfile

    from specdec.models.transformer import Transformer
    from tests.conftest import write_tiny_model

    return {name: Transformer.from_dir(write_tiny_model(Path(tempfile.mkdtemp()), std=std), "fp32")
            for name, std in (("lookup", 0.02), ("scripted", 0.3))}


if __name__ == "__main__":
    from tests.conftest import FakeTokenizer

    torch.set_num_threads(1)
    RECORD.write_text(json.dumps(record(tiny_targets(), FakeTokenizer(eos=()))) + "\n")
    print(f"wrote {RECORD}")
