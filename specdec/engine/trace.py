"""The round-by-round trace of one generation (`specdec generate --trace`), read by the explainer page."""

from __future__ import annotations

import json
from pathlib import Path

TRACE_FORMAT, TRACE_VERSION = "specdec-trace", 1


def build_trace(result, tokenizer, *, model: str, drafter: str, k: int, temperature: float, prompt: str,
                k_policy: str = "fixed") -> dict:
    """k: the deepest draft a round could have (with k_policy "auto", the planner's bound: rounds vary below it)."""
    piece = (lambda t: tokenizer.decode([t])) if tokenizer else str
    rounds = [{
        "drafted": r.drafted,
        "drafted_text": [piece(t) for t in r.drafted],
        "accepted": r.accepted,
        "token": r.token,
        "token_text": piece(r.token),
        "kind": r.kind,
        "emitted": r.emitted,  # tokens kept: fewer than accepted + 1 when EOS, a stop or the budget cut the round
        "draft_s": r.draft_s,
        "verify_s": r.verify_s,
    } for r in result.stats.rounds]
    summary = result.stats.summary()
    return {
        "format": TRACE_FORMAT, "version": TRACE_VERSION,
        "model": model, "drafter": drafter, "k": k, "k_policy": k_policy, "temperature": temperature,
        "prompt": prompt,
        "first_token": result.token_ids[0] if result.token_ids else None,
        "rounds": rounds,
        "summary": {"alpha": summary["alpha"], "mean_tokens_per_round": summary["mean_tokens_per_round"],
                    "rounds": summary["rounds"], "tokens": summary["generated_tokens"],
                    "tokens_per_s": summary["tokens_per_s"]},
    }


def write_trace(trace: dict, path: str | Path) -> None:
    """Written whole or not at all (specdec.atomic)."""
    from specdec.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(trace, indent=1))
