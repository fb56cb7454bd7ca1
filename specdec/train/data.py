"""Self-distillation data for a draft head: the target's own greedy answers to training prompts, and the target's
hidden states over each whole conversation (what the head reads at inference time).

The prompts are Spec-Bench items the benchmark does not report: `specdec bench` takes the first items of each
category in file order, so the first `holdout` of every category are held out here, whatever else is given.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.atomic import atomic_file, write_text_atomic
from specdec.errors import SpecdecError

HOLDOUT = 8  # per category: held out of training, more than the 5 a default benchmark run reports
SOFT_TOP = 16  # the target's most likely next tokens kept per position, with their log-probabilities (soft labels)


@dataclass
class Example:
    tokens: list[int]  # the chat-formatted prompt followed by a greedy answer
    prompt_len: int


def training_texts(paths: Sequence[str | Path], holdout: int = HOLDOUT) -> list[str]:
    """Prompt texts from Spec-Bench files (first turns; the first `holdout` items of each category left out) or
    plain JSONL files ({"prompt": ...}, every line used)."""
    from specdec.bench.prompts import load_prompts

    texts: list[str] = []
    for path in paths:
        seen: dict[str, int] = {}
        for p in load_prompts(path):
            seen[p.category] = seen.get(p.category, 0) + 1
            if p.category != "custom" and seen[p.category] <= holdout:
                continue
            texts.append(p.turns[0])
    if not texts:
        raise SpecdecError("no training prompts left after holding out the benchmark's items")
    return texts


def answers(loaded, texts: Sequence[str], max_new_tokens: int, batch: int = 32) -> list[Example]:
    """Greedy answers, `batch` prompts at a time. The model writing them may be a faster copy of the target
    (gguf-q8): the labels the head learns are the target's own next-token choices along these texts, taken by
    `hidden_states`, so only the texts come from here."""
    from specdec.engine.generate import Engine, GenerationConfig
    from specdec.models.text.tokenizer import encode_prompt

    engine = Engine(loaded.model, loaded.tokenizer)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    out: list[Example] = []
    limit = loaded.model.cfg.max_position_embeddings - max_new_tokens - 8
    prompts = [p for p in (encode_prompt(loaded.tokenizer, t, chat=True) for t in texts) if len(p) <= limit]
    if not prompts:
        raise SpecdecError(f"none of the {len(texts)} training prompts leaves room for {max_new_tokens} new tokens "
                           f"in the model's {loaded.model.cfg.max_position_embeddings} positions (lower --max-tokens)")
    bar = tqdm(total=len(prompts), desc="answers", unit="prompt", file=sys.stderr)
    for a in range(0, len(prompts), batch):
        part = prompts[a:a + batch]
        for p, r in zip(part, engine.generate(part, cfg)):
            out.append(Example(list(p) + r.token_ids, len(p)))
        bar.update(len(part))
    bar.close()
    return out


@dataclass
class Features:
    feats: list[torch.Tensor]  # per example [len, len(taps) * hidden] fp16: the target's features at each position
    labels: list[torch.Tensor]  # per example [len] long: the target's greedy next token after each position
    # per example ([len, SOFT_TOP] int32 ids, [len, SOFT_TOP] fp16 log-probabilities): the target's most likely
    # next tokens after each position; None for data written before soft labels (hard labels only)
    soft: list[tuple[torch.Tensor, torch.Tensor]] | None = None


def hidden_states(model, examples: Sequence[Example], taps: tuple[int, ...], top: int = SOFT_TOP) -> Features:
    """The target's features, greedy choices and `top` most likely next tokens along every example, from one
    prefill each (the native kernels compute a prefill row exactly as a decode row, so these are what decoding
    would see)."""
    feats, labels, soft = [], [], []
    cache = model.new_cache(1, max(len(e.tokens) for e in examples))
    for e in tqdm(examples, desc="features", unit="example", file=sys.stderr):
        tapped = model.forward_tapped(torch.tensor([e.tokens]), torch.tensor([0]), cache.row(0), taps, prefill=True)
        logits, f = tapped.logits, tapped.features
        feats.append(f[0].half())  # [n, taps * hidden]
        labels.append(logits[0].argmax(-1))  # [n]
        logp, ids = logits[0].float().log_softmax(-1).topk(top, dim=-1)  # [n, top]
        soft.append((ids.int(), logp.half()))
    return Features(feats, labels, soft)


def save(path: Path, examples: Sequence[Example], feats: Features, meta: dict) -> None:
    """Written whole or not at all (a later run reuses data.pt when it is there)."""
    path.mkdir(parents=True, exist_ok=True)
    with atomic_file(path / "data.pt") as f:
        torch.save({"tokens": [e.tokens for e in examples], "prompt_len": [e.prompt_len for e in examples],
                    "feats": feats.feats, "labels": feats.labels, "soft": feats.soft}, f)
    write_text_atomic(path / "data.json", json.dumps(meta, indent=1) + "\n")


def load(path: Path) -> tuple[list[Example], Features, dict]:
    try:
        blob = torch.load(path / "data.pt")
        meta = json.loads((path / "data.json").read_text())
    except (OSError, RuntimeError, KeyError, json.JSONDecodeError) as e:
        raise SpecdecError(f"{path}: unreadable training data ({e})") from None
    examples = [Example(t, n) for t, n in zip(blob["tokens"], blob["prompt_len"])]
    return examples, Features(blob["feats"], blob["labels"], blob.get("soft")), meta
