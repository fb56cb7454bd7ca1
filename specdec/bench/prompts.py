"""Benchmark prompts: the Spec-Bench format ({"question_id", "category", "turns": [...]}, one object a line) and
plain JSONL ({"prompt": "..."}, category "custom"), with a category filter and a per-category cap."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.inputs import read_text

CUSTOM = "custom"


@dataclass(frozen=True)
class Prompt:
    qid: str
    category: str
    turns: tuple[str, ...]  # user messages; turn t is asked after the model's own answers to turns < t


def parse_line(text: str, where: str, lineno: int) -> Prompt:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{where}:{lineno}: not valid JSON ({e.msg})") from None
    if isinstance(obj, dict) and "turns" in obj:
        turns, category = obj["turns"], obj.get("category")
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
            raise SpecdecError(f"{where}:{lineno}: 'turns' must be a non-empty list of non-empty strings")
        if not isinstance(category, str) or not category:
            raise SpecdecError(f"{where}:{lineno}: a Spec-Bench item needs a 'category' string")
        return Prompt(str(obj.get("question_id", lineno)), category, tuple(turns))
    if isinstance(obj, dict) and "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise SpecdecError(f"{where}:{lineno}: 'prompt' must be a non-empty string")
        return Prompt(str(obj.get("id", lineno)), CUSTOM, (obj["prompt"],))
    raise SpecdecError(f"{where}:{lineno}: expected an object with 'turns' (Spec-Bench) or 'prompt'")


def load_prompts(path: str | Path) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise SpecdecError(f"prompt file not found: {path} (Spec-Bench's question.jsonl is data/spec_bench/"
                           'question.jsonl in the Spec-Bench repository; or write JSONL lines of {"prompt": ...})')
    prompts, seen = [], set()
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if line.strip():
            p = parse_line(line, str(path), lineno)
            if p.qid in seen:
                raise SpecdecError(f"{path}:{lineno}: duplicate question id {p.qid}")
            seen.add(p.qid)
            prompts.append(p)
    if not prompts:
        raise SpecdecError(f"{path}: no prompts in this file")
    return prompts


def categories_of(prompts: Sequence[Prompt]) -> list[str]:
    """Categories in order of first appearance."""
    return list(dict.fromkeys(p.category for p in prompts))


def select(prompts: Sequence[Prompt], categories: Sequence[str] | None = None,
           per_category: int | None = None) -> list[Prompt]:
    """The prompts of the chosen categories (all by default), in file order, at most per_category of each."""
    known = categories_of(prompts)
    wanted = list(dict.fromkeys(categories)) if categories else known
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise SpecdecError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} "
                           f"(this file has: {', '.join(known)})")
    if per_category is not None and per_category < 1:
        raise SpecdecError(f"--per-category must be >= 1, got {per_category}")
    taken: dict[str, int] = {}
    out = []
    for p in prompts:
        if p.category in wanted and (per_category is None or taken.get(p.category, 0) < per_category):
            taken[p.category] = taken.get(p.category, 0) + 1
            out.append(p)
    if not out:
        raise SpecdecError("no prompts selected")
    return out


def parse_categories(text: str | None) -> list[str] | None:
    if not text:
        return None
    cats = [c.strip() for c in text.split(",") if c.strip()]
    if not cats:
        raise SpecdecError("--categories is empty")
    return cats
