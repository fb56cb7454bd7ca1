"""Run every method on every prompt, interleaved so that slow drift of the machine cancels in the ratios.

A method is a name and a function (prompt ids, max new tokens) -> Turn; the engine's plain and speculative
decoding and Hugging Face's generate are all wrapped into one. Prompt i runs the methods rotated by i
(plain, spec; spec, plain; ...). Multi-turn items ask turn t after the method's own answers to turns < t.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.bench.prompts import Prompt
from specdec.engine.stats import RoundRecord
from specdec.measure import decode_tokens_per_s, tokens_per_s
from specdec.models.text.tokenizer import encode_text


@dataclass
class Turn:
    """One generation, by the engine, by Hugging Face generate, or by a server over HTTP."""

    prompt_ids: list[int]  # [] from a server (it applies its own chat template)
    token_ids: list[int]  # [] from a server (it streams text)
    text: str
    finish: str  # "eos" | "stop" | "length"
    seconds: float  # from the call to the last token
    ttft_s: float | None
    token_times: list[float]  # seconds since the call, per generated token; per streamed chunk from a server
    rounds: list[RoundRecord] | None = None  # the engine's rounds; None for Hugging Face and servers
    completion_tokens: int | None = None  # a server's usage.completion_tokens (its token ids are not seen)
    prompt_tokens: int | None = None  # a server's usage.prompt_tokens
    drafted: int | None = None  # draft tokens a server reported for this turn (counters or per response)
    accepted: int | None = None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else len(self.token_ids)

    @property
    def chunked(self) -> bool:
        """token_times are one per streamed chunk (a server), not one per token."""
        return self.completion_tokens is not None


@dataclass
class Sample:
    """One prompt (all its turns) through one method."""

    qid: str
    category: str
    method: str
    turns: list[Turn]
    identical: bool | None = None  # same output as the baseline method's (None: no baseline)
    mismatch: dict | None = None  # where and by how much the first difference arose

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.turns)

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_s(self.tokens, self.seconds)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The decode phase over the sample's turns (prefill excluded; identical work for every method on one
        prompt). None where a first token's time is unknown."""
        if any(t.ttft_s is None for t in self.turns):
            return None
        tokens = sum(max(t.tokens - 1, 0) for t in self.turns)
        return decode_tokens_per_s(tokens + 1, self.seconds, sum(t.ttft_s for t in self.turns))


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
    return encode_text(tokenizer, "\n\n".join(parts))


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


def _output(turn: Turn) -> list[int] | str:
    """What identity compares: token ids where the method exposes them, else (a server) the text."""
    return turn.text if turn.chunked else turn.token_ids


def mark_identity(samples: list[Sample], methods: Sequence[Method], logit_gap=None) -> None:
    """Compare each sample's output with its baseline method's on the same prompt, turn by turn; at the first
    difference record the position (a token, or a character of a server's text) and, when `logit_gap(ids) ->
    (gap, top1, top2)` is given (specdec methods), the target's top-1 minus top-2 logit for the baseline's
    prefix there."""
    by_key = {(s.qid, s.method): s for s in samples}
    family = {m.name: m for m in methods}
    for s in samples:
        m = family[s.method]
        base = by_key.get((s.qid, m.baseline)) if m.baseline else None
        if base is None:
            continue
        s.identical = all(_output(a) == _output(b) for a, b in zip(s.turns, base.turns))
        if s.identical:
            continue
        t, (mine, ref) = next((i, (a, b)) for i, (a, b) in enumerate(zip(s.turns, base.turns))
                              if _output(a) != _output(b))
        out, ref_out = _output(mine), _output(ref)
        pos = next((i for i, (x, y) in enumerate(zip(out, ref_out)) if x != y), min(len(out), len(ref_out)))
        s.mismatch = {"turn": t, "position": pos, "token": out[pos] if pos < len(out) else None,
                      "baseline_token": ref_out[pos] if pos < len(ref_out) else None}
        if logit_gap is not None and m.family == "specdec":
            gap, top1, top2 = logit_gap(ref.prompt_ids + ref.token_ids[:pos])
            s.mismatch.update(logit_gap=gap, top1=top1, top2=top2)


# --- the engine as a method --------------------------------------------------------------------------------


def turn_from_result(prompt_ids: list[int], result) -> Turn:
    st = result.stats
    return Turn(list(prompt_ids), list(result.token_ids), result.text, result.finish_reason, st.total_s,
                st.ttft_s, list(st.token_times), list(st.rounds))


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
