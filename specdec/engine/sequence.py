"""One request as the step loop sees it: its tokens, its own sampling settings and random stream, its stop
rules, where it sits in the KV pool, and what it measured.

Tokens become final through `emit`, which applies the end-of-sequence tokens, the token budget and the stop
strings, in that order, and returns how many of the offered tokens stayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.engine.stats import RequestStats
from specdec.errors import SpecdecError
from specdec.sampling.warp import SamplingConfig

STOP_WINDOW = 8  # output tokens decoded before a round's new ones, beyond the longest stop string's length


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()  # stop strings: generation ends when the text contains one (it is cut off)
    lossy_typical_acceptance: bool = False  # LOSSY: Medusa-style typical acceptance; output is not the target's

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max new tokens must be >= 1, got {self.max_new_tokens}")


class ContextExceeded(SpecdecError):
    """A prompt, or a prompt with the tokens asked for, that does not fit a sequence's context. `param`: what to
    shorten (the prompt, or max_tokens); `room`: the tokens there is room for after the prompt."""

    def __init__(self, message: str, param: str, room: int):
        super().__init__(message)
        self.param, self.room = param, room


def context_room(prompt_len: int, context: int, max_tokens: int | None = None) -> int:
    """Tokens a sequence may generate after a prompt of prompt_len in `context` positions: the one context check
    (the scheduler's, and the server's before it queues a request). ContextExceeded when the prompt leaves no room
    for one token, or max_tokens (None: not asked) more than there is."""
    room = context - prompt_len
    if room < 1:
        raise ContextExceeded(f"the prompt is {prompt_len} tokens; the context is {context}", "prompt", room)
    if max_tokens is not None and max_tokens > room:
        raise ContextExceeded(f"max_tokens {max_tokens} with a prompt of {prompt_len} tokens exceeds the context of "
                              f"{context} (at most {room})", "max_tokens", room)
    return room


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text up to the first stop string it contains."""
    found = [text.find(s) for s in stop if s in text]
    return text[: min(found)] if found else text


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def new_generator(seed: int | None, device="cpu") -> torch.Generator:
    """A request's own random stream: seeded when asked, else from torch's global stream."""
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return g


class Evidence:
    """What the automatic policy knows about one sequence's drafts: per draft position, drafts judged there
    (verified, or shadow-scored) and how many were accepted. `tokens` is the sequence (prompt, then output) and
    `prompt_len` where its output starts; a subclass keeps both (the step loop's `Sequence`, a row of vLLM's batch in
    integrations/vllm.py)."""

    tokens: list[int]
    prompt_len: int

    def __init__(self, max_k: int):
        self.judged = [0] * max_k
        self.hits = [0] * max_k
        self.shadow: tuple[int, list[int], int] | None = None  # (output index it continues, drafts, verified)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def record(self, drafted: int, accepted: int, first: int = 0) -> None:
        """Positions first..accepted were judged (up to the drafted ones), first..accepted-1 accepted."""
        for i in range(first, min(drafted, accepted + 1, len(self.judged))):
            self.judged[i] += 1
            self.hits[i] += i < accepted

    def set_shadow(self, drafted: list[int], verified: int = 0) -> None:
        """Drafts the policy chose not to verify (a free, deterministic drafter's; the first `verified` of them
        are verified this round and recorded as such). Scored against the tokens the target emits next: for a
        one-hot q, a draft token equals the target's next token with probability p(x), its acceptance
        probability, so shadow scores estimate acceptance without a verify pass."""
        if self.shadow is None and len(drafted) > verified:
            self.shadow = (self.num_generated, list(drafted), verified)

    def score_shadow(self) -> None:
        if self.shadow is None:
            return
        at, drafted, verified = self.shadow
        toks, at = self.tokens, self.prompt_len + at  # the output, without copying it out every round
        n = 0  # leading draft tokens that match the output
        while n < len(drafted) and at + n < len(toks) and toks[at + n] == drafted[n]:
            n += 1
        if n < len(drafted) and at + n >= len(toks):
            return  # every emitted token matched so far: wait for the next one
        if n >= verified:  # the shadowed positions continue a context the target did produce
            self.record(len(drafted), n, first=verified)
        self.shadow = None


class Sequence(Evidence):
    """A request in the step loop. `slot` is its row of the KV pool while it holds one; `length` counts the
    positions of that row holding valid keys and values; `prefilled` the prompt tokens already prefilled."""

    def __init__(self, prompt: list[int], cfg: GenerationConfig, rid: object = None, device="cpu",
                 max_k: int = 32):
        if not prompt:
            raise SpecdecError("every prompt needs at least one token")
        self.rid, self.cfg = rid, cfg
        self.prompt_len = len(prompt)
        self.tokens = list(prompt)  # prompt + generated: the context a drafter continues
        self.origins: list[str] = []  # per generated token: "prefill" | "accepted" | "recovered" | "bonus"
        self.finish: str | None = None  # "eos" | "stop" | "length" | "abort"
        self.stats = RequestStats(prompt_tokens=len(prompt))
        self.generator = new_generator(cfg.sampling.seed, device)
        self.slot: int | None = None
        self.length = 0
        self.prefilled = 0
        self.t0 = time.perf_counter()  # when the request arrived
        super().__init__(max_k)  # the automatic policy's evidence about this request

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def prompt(self) -> list[int]:
        return self.tokens[:self.prompt_len]

    @property
    def running(self) -> bool:
        """Prefilled, first token out, not finished: it takes part in decode rounds."""
        return self.finish is None and self.prefilled == self.prompt_len and self.num_generated > 0

    def emit(self, token_ids: list[int], origins: list[str], eos: set[int], tokenizer) -> list[int]:
        """Append the round's tokens, applying EOS, the token budget and stop strings. Returns those kept."""
        kept = []
        for t in token_ids:
            if t in eos:
                self.finish = "eos"
                break
            kept.append(t)
            if self.num_generated + len(kept) >= self.cfg.max_new_tokens:
                self.finish = "length"
                break
        if self.cfg.stop and tokenizer is not None and kept:
            kept = self._cut_at_stop(kept, tokenizer)
        now = time.perf_counter() - self.t0
        if self.num_generated == 0:
            self.stats.ttft_s = now
        self.tokens.extend(kept)
        self.origins.extend(origins[: len(kept)])
        self.stats.token_times.extend([now] * len(kept))
        self.score_shadow()
        return kept

    def _cut_at_stop(self, kept: list[int], tokenizer) -> list[int]:
        """Keep tokens up to the one that completes a stop string; the text is cut at the stop string.

        Incremental: the output so far holds no stop string (every earlier token was checked), so a new one must
        end in text that the new tokens changed or added. Each prefix of the round's tokens is decoded after a
        window of the output's last tokens (STOP_WINDOW more than the longest stop string has characters, so
        that merges across tokens, such as a character's UTF-8 bytes split between two, decode as in the whole
        text), and a stop string is looked for only where it could end past the point at which the text stopped
        agreeing with the previous prefix's. Each token costs a decode of that window, not of the output."""
        longest = max(len(s) for s in self.cfg.stop)
        window = self.tokens[max(self.prompt_len, len(self.tokens) - longest - STOP_WINDOW):]
        seen = tokenizer.decode(window)
        for i in range(1, len(kept) + 1):
            text = tokenizer.decode(window + kept[:i])
            same = _common_prefix(seen, text)  # text before this agrees with the previous prefix's
            if any(text.find(s, max(0, same - max(len(s), 1) + 1)) >= 0 for s in self.cfg.stop):
                self.finish = "stop"
                return kept[:i]
            seen = text
        return kept

    def text(self, tokenizer) -> str:
        if tokenizer is None:
            return ""
        return cut_at_stop(tokenizer.decode(self.output), self.cfg.stop) if self.finish == "stop" else \
            tokenizer.decode(self.output)
