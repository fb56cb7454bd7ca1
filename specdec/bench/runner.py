"""Run every method on every prompt, interleaved so that slow drift of the machine cancels in the ratios.

A method is a name and a function (prompt ids, max new tokens) -> Turn; the engine's plain and speculative
decoding and Hugging Face's generate are all wrapped into one. Prompt i runs the methods rotated by i
(plain, spec; spec, plain; ...). Multi-turn items ask turn t after the method's own answers to turns < t.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specdec.bench.prompts import Prompt


class Round(NamedTuple):
    """One target pass after the prefill, as the engine recorded it (see specdec.engine.stats.RoundRecord)."""

    drafted: int  # tokens drafted
    accepted: int  # of them, kept
    emitted: int  # tokens added to the output
    draft_s: float
    verify_s: float
    t: float = 0.0  # seconds since the call when the round's tokens were final


@dataclass
class Turn:
    """One generation."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish: str  # "eos" | "stop" | "length"
    seconds: float  # from the call to the last token
    ttft_s: float
    token_times: list[float]  # seconds since the call, per generated token
    rounds: list[Round] | None = None  # None for Hugging Face generate


@dataclass
class Sample:
    """One prompt (all its turns) through one method."""

    qid: str
    category: str
    method: str
    turns: list[Turn]
    identical: bool | None = None  # same tokens as the baseline method's (None: no baseline)
    mismatch: dict | None = None  # where and by how much the first difference arose

    @property
    def tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.turns)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first (prefill excluded; identical work for every
        method on one prompt). None where the first token's time is unknown."""
        if any(t.ttft_s is None for t in self.turns):
            return None
        seconds = sum(t.seconds - t.ttft_s for t in self.turns)
        tokens = sum(max(len(t.token_ids) - 1, 0) for t in self.turns)
        return tokens / seconds if seconds > 0 else None


GenerateFn = Callable[[list[int], int], Turn]


@dataclass
class Method:
    name: str
    generate: GenerateFn
    family: str = "specdec"  # "specdec" | "hf"
    baseline: str | None = None  # the method this one's speedup and identity are measured against
    k: int | str | None = None  # draft depth, "auto", or None for plain decoding
    meter: object | None = None  # the engine's running acceptance estimate (AcceptanceMeter)
    meter_trace: list = field(default_factory=list)  # (qid, alpha, ema) after each prompt


def encode_turns(tokenizer, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Token ids of the conversation: user turns with the assistant's answers in between, ending with the
    prompt for the next answer (the chat template when the tokenizer has one, else the text joined)."""
    if getattr(tokenizer, "chat_template", None):
        messages = []
        for i, user in enumerate(turns):
            messages.append({"role": "user", "content": user})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    parts = [x for pair in zip(turns, list(answers) + [""]) for x in pair if x]
    return tokenizer.encode("\n\n".join(parts))


def run_prompt(prompt: Prompt, method: Method, tokenizer, max_new_tokens: int) -> Sample:
    turns: list[Turn] = []
    for t in range(len(prompt.turns)):
        ids = encode_turns(tokenizer, prompt.turns[: t + 1], [x.text for x in turns])
        turns.append(method.generate(ids, max_new_tokens))
    return Sample(prompt.qid, prompt.category, method.name, turns)


def run_bench(prompts: Sequence[Prompt], methods: Sequence[Method], tokenizer, max_new_tokens: int,
              warmup_tokens: int = 8, progress: bool = True) -> list[Sample]:
    """Every method on every prompt, rotated per prompt; one short warm-up generation per method first."""
    from tqdm import tqdm

    if warmup_tokens:
        ids = encode_turns(tokenizer, prompts[0].turns[:1], [])
        for m in methods:
            m.generate(ids, min(warmup_tokens, max_new_tokens))
    samples = []
    with tqdm(total=len(prompts) * len(methods), desc="bench", unit="run", file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for i, p in enumerate(prompts):
            shift = i % len(methods)
            for m in list(methods[shift:]) + list(methods[:shift]):
                bar.set_postfix_str(f"{p.category} #{p.qid} {m.name}", refresh=False)
                samples.append(run_prompt(p, m, tokenizer, max_new_tokens))
                if m.meter is not None:
                    m.meter_trace.append((p.qid, m.meter.alpha, m.meter.ema))
                bar.update()
    return samples


def mark_identity(samples: list[Sample], methods: Sequence[Method], logit_gap=None) -> None:
    """Compare each sample's tokens with its baseline method's on the same prompt, turn by turn; at the first
    difference record the position and, when `logit_gap(ids) -> (gap, top1, top2)` is given (specdec methods),
    the target's top-1 minus top-2 logit for the baseline's prefix there."""
    by_key = {(s.qid, s.method): s for s in samples}
    family = {m.name: m for m in methods}
    for s in samples:
        m = family[s.method]
        base = by_key.get((s.qid, m.baseline)) if m.baseline else None
        if base is None:
            continue
        s.identical = all(a.token_ids == b.token_ids for a, b in zip(s.turns, base.turns))
        if s.identical:
            continue
        t, (mine, ref) = next((i, (a, b)) for i, (a, b) in enumerate(zip(s.turns, base.turns))
                              if a.token_ids != b.token_ids)
        pos = next((i for i, (x, y) in enumerate(zip(mine.token_ids, ref.token_ids)) if x != y),
                   min(len(mine.token_ids), len(ref.token_ids)))
        s.mismatch = {"turn": t, "position": pos,
                      "token": mine.token_ids[pos] if pos < len(mine.token_ids) else None,
                      "baseline_token": ref.token_ids[pos] if pos < len(ref.token_ids) else None}
        if logit_gap is not None and m.family == "specdec":
            gap, top1, top2 = logit_gap(ref.prompt_ids + ref.token_ids[:pos])
            s.mismatch.update(logit_gap=gap, top1=top1, top2=top2)


# --- the engine as a method --------------------------------------------------------------------------------


def turn_from_result(prompt_ids: list[int], result) -> Turn:
    st = result.stats
    rounds = [Round(len(r.drafted), r.accepted, r.emitted, r.draft_s, r.verify_s, r.t) for r in st.rounds]
    return Turn(list(prompt_ids), list(result.token_ids), result.text, result.finish_reason, st.total_s,
                st.ttft_s, list(st.token_times), rounds)


def engine_method(name: str, engine, drafter, k, baseline: str | None = None,
                  k_label: int | str | None = None) -> Method:
    """Greedy decoding at batch 1 through Engine.generate; k is an int or a policy (ignored for NoDrafter).
    Give each method its own Engine: its meter then holds that method's running acceptance estimate."""
    from specdec.engine.generate import GenerationConfig

    def generate(ids: list[int], max_new_tokens: int) -> Turn:
        result = engine.generate([ids], GenerationConfig(max_new_tokens=max_new_tokens), drafter, k)[0]
        return turn_from_result(ids, result)

    return Method(name, generate, "specdec", baseline, k_label, engine.meter if baseline else None)


def logit_gap_fn(model):
    """ids -> (top-1 minus top-2 logit, top-1 id, top-2 id) of the target's next-token logits after ids."""

    def gap(ids: list[int]) -> tuple[float, int, int]:
        cache = model.new_cache(1, len(ids) + 1)
        logits = model.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.long), cache,
                               last_only=torch.tensor([len(ids) - 1]), prefill=True)[0]  # [vocab]
        top = torch.topk(logits.float(), 2)
        return float(top.values[0] - top.values[1]), int(top.indices[0]), int(top.indices[1])

    return gap
