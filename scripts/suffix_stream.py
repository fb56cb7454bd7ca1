"""Suffix decoding on a stream of related requests, against prompt lookup, in one run (issue 9).

Two streams through one process, greedy, batch 1, the methods rotated per request:
  multi-turn  MT-Bench's two-turn conversations (the Spec-Bench categories writing ... humanities): turn 1, then
              turn 2 with the model's own first answer in its context ("Rewrite your previous response ...").
  repeat      the same first turns asked a second time, as a retry or an agent loop would: the answer is no
              longer in the prompt, only in what this process generated before.
The suffix drafter's shared index keeps what it generated for earlier requests (bounded); prompt lookup sees only
the request's own context. Reports, per stream and turn: tokens per second against plain decoding, tokens per
target pass, and whether every output equals plain decoding's.

    .venv/bin/python scripts/suffix_stream.py --per-category 3 --max-new-tokens 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specdec.atomic import write_text_atomic
from specdec.bench.prompts import load_prompts, select
from specdec.bench.runner import engine_method, run_bench
from specdec.drafters.base import NoDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.calibrate import parse_k, policy_for
from specdec.engine.generate import Engine
from specdec.errors import SpecdecError
from specdec.models.loader import load_model

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def stats(samples, method: str, turn: int) -> dict:
    """Tokens, seconds and target passes of one method's turn `turn` over the samples."""
    turns = [s.turns[turn] for s in samples if s.method == method and len(s.turns) > turn]
    tokens = sum(t.tokens for t in turns)
    seconds = sum(t.seconds for t in turns)
    passes = sum(len(t.rounds) for t in turns if t.rounds is not None)
    return {"requests": len(turns), "tokens": tokens, "seconds": seconds,
            "tok_s": tokens / seconds if seconds else 0.0, "tokens_per_pass": tokens / passes if passes else None}


def identical(samples, method: str) -> float:
    plain = {s.qid: [t.token_ids for t in s.turns] for s in samples if s.method == "plain"}
    mine = [s for s in samples if s.method == method]
    return sum([t.token_ids for t in s.turns] == plain[s.qid] for s in mine) / len(mine)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--precision", default=None, help="default: the model's default path")
    ap.add_argument("--k", default="auto", help="an integer, or auto (the planner over measured pass costs)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    try:
        k = parse_k(args.k)
        loaded = load_model("default", args.precision)
    except SpecdecError as e:
        print(f"suffix_stream: {e}", file=sys.stderr)
        return 2
    model, tok = loaded.model, loaded.tokenizer
    prompts = select(load_prompts(args.prompts), MT_BENCH, args.per_category)

    def method(name, drafter):
        return engine_method(name, Engine(model, tok), drafter, policy_for(k, model, drafter),
                             None if name == "plain" else "plain")

    # one drafter object per method for the whole run: the suffix index persists from stream to stream
    methods = [method("plain", NoDrafter()), method("ngram", NgramDrafter()), method("suffix", SuffixDrafter())]
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "precision": model.precision, "k": k,
           "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(), "streams": {}}
    streams = {"multi-turn": prompts, "repeat": [replace(p, turns=p.turns[:1]) for p in prompts]}
    for name, stream in streams.items():
        samples = run_bench(stream, methods, tok, args.max_new_tokens, warmup_tokens=8 if name == "multi-turn" else 0)
        rows = {}
        for turn in range(max(len(p.turns) for p in stream)):
            base = stats(samples, "plain", turn)
            for m in ("ngram", "suffix"):
                s = stats(samples, m, turn)
                rows[f"{m} turn {turn + 1}"] = {**s, "speedup": s["tok_s"] / base["tok_s"],
                                                "plain_tok_s": base["tok_s"]}
        for m in ("ngram", "suffix"):
            rows[f"{m} identical"] = identical(samples, m)
        out["streams"][name] = rows
    lines = [f"# Suffix decoding on a stream of related requests ({out['date']})", "",
             f"{len(prompts)} MT-Bench conversations ({args.per_category} per category), {model.precision} path, "
             f"k = {k}, {args.max_new_tokens} new tokens a turn, greedy, batch 1; one process, methods rotated "
             "per request. `repeat` asks the same first turns again after the multi-turn stream.", "",
             "| stream | turn | plain tok/s | ngram speedup | ngram tokens/pass | suffix speedup | "
             "suffix tokens/pass |",
             "|---|---|---|---|---|---|---|"]
    for name, rows in out["streams"].items():
        for turn in (1, 2):
            n, s = rows.get(f"ngram turn {turn}"), rows.get(f"suffix turn {turn}")
            if n is None:
                continue
            lines.append(f"| {name} | {turn} | {n['plain_tok_s']:.1f} | {n['speedup']:.2f}x | "
                         f"{n['tokens_per_pass']:.2f} | {s['speedup']:.2f}x | {s['tokens_per_pass']:.2f} |")
        lines.append(f"| {name} | identical to plain | | {rows['ngram identical']:.0%} | | "
                     f"{rows['suffix identical']:.0%} | |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        write_text_atomic(args.json, json.dumps(out, indent=1) + "\n")
        write_text_atomic(args.json.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
