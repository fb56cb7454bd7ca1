"""The report of `specdec bench long-context` (specdec.bench.hardware.long_context): tables of the decode pass against
its floors per context, time to first token, n-gram on long prompts, the prefix cache and llama.cpp, then each
goal's PASS/FAIL line."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.bench.engines.llamacpp_compare import PlainAndLookup
from specdec.bench.results import Result

ROWS = list(range(1, 10))  # token-rows of the verify cost curve


@dataclass
class ContextPass:
    """The one-row decode pass after `context` cached tokens, its floors, and the verify cost curve there."""

    context: int
    step_s: float
    floor_s: float  # memory: weight bytes plus the context's KV bytes at the measured bandwidth
    compute_floor_s: float
    verify_cost: dict[str, float]  # rows ("1".."9") -> T(n) / T(1)


@dataclass
class TtftPoint:
    prompt_tokens: int
    ttft_s: float
    compute_floor_s: float


@dataclass
class NgramRow:
    """n-gram speculation on one long copy-heavy prompt, decode phase, greedy."""

    prompt: str
    prompt_tokens: int
    new_tokens: int
    plain_tok_s: float
    ttft_s: float
    k5_tok_s: float
    k5_speedup: float
    k5_tokens_per_pass: float
    auto_tok_s: float
    auto_speedup: float
    identical: bool  # plain, k = 5 and auto gave the same tokens


@dataclass
class PrefixRun:
    """Two questions about one document through one Engine with a prefix cache."""

    prompt_tokens: list[int]
    cached_tokens: int
    first_ttft_s: float
    second_ttft_s: float
    ratio: float  # second / first


@dataclass
class LongContextRun(Result):
    """`specdec bench long-context`: long-context.json."""

    bandwidth_gb_s: float
    fma_peak_gmac_s: float
    weight_bytes: int
    kv_bytes_per_position: int
    passes: list[ContextPass]
    ttft: list[TtftPoint]
    ngram: list[NgramRow]
    prefix: PrefixRun
    llamacpp: PlainAndLookup | None
    threads: int
    products_gmac_s: float | None = None  # the rate the matrix products are issued at (runs before 2026-12-01 lack it)
    products_arithmetic: str | None = None
    machine: dict = field(default_factory=dict)  # provenance (runs before 2026-12-02 lack it)
    kv_cache: str = "f16"  # the KV cache type (models/kv_cache.py; runs before there were types lack it: f16)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(r: LongContextRun) -> str:
    at = {p.context: p for p in r.passes}
    products = ("" if r.products_gmac_s is None else
                f", the matrix products' {r.products_gmac_s:.0f} G/s ({r.products_arithmetic}; {r.threads} threads)")
    lines = ["# Long contexts on the bundled model", "",
             "Measured by `specdec bench long-context` (`make long-context`) in one run; greedy; 2 threads.", "",
             f"Machine: read bandwidth {r.bandwidth_gb_s:.1f} GB/s, fp32 multiply-add peak "
             f"{r.fma_peak_gmac_s:.0f} G/s{products}; weights {r.weight_bytes / 1e6:.0f} MB "
             f"a pass, KV cache {r.kv_cache}: {r.kv_bytes_per_position / 1e3:.1f} KB a position.", "",
             "| context | decode ms/token | tok/s | vs 512 | memory floor ms | of floor | compute floor ms | "
             + " | ".join(f"{n} rows" for n in ROWS[1:]) + " |",
             "|---" * (7 + len(ROWS) - 1) + "|"]
    for c, p in at.items():
        lines.append(f"| {c} | {p.step_s * 1e3:.1f} | {1 / p.step_s:.1f} | "
                     f"{at[512].step_s / p.step_s:.2f} | {p.floor_s * 1e3:.1f} | "
                     f"{p.floor_s / p.step_s:.0%} | {p.compute_floor_s * 1e3:.1f} | "
                     + " | ".join(f"{p.verify_cost[str(n)]:.2f}" for n in ROWS[1:]) + " |")
    lines += ["", "| prompt tokens | time to first token | compute floor | ratio |", "|---|---|---|---|"]
    for t in r.ttft:
        lines.append(f"| {t.prompt_tokens} | {t.ttft_s:.2f} s | {t.compute_floor_s:.2f} s | "
                     f"{t.ttft_s / t.compute_floor_s:.2f} |")
    lines += ["", "| prompt | tokens | plain tok/s | n-gram k=5 tok/s | speedup | tokens/pass | auto tok/s | "
              "speedup | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for n in r.ngram:
        lines.append(f"| {n.prompt} | {n.prompt_tokens} | {n.plain_tok_s:.1f} | {n.k5_tok_s:.1f} | "
                     f"{n.k5_speedup:.2f}x | {n.k5_tokens_per_pass:.2f} | {n.auto_tok_s:.1f} | "
                     f"{n.auto_speedup:.2f}x | {n.identical} |")
    p = r.prefix
    lines += ["", f"Prefix cache: first question {p.first_ttft_s:.2f} s to first token, second question on the "
              f"same document {p.second_ttft_s:.3f} s ({p.ratio:.1%}; {p.cached_tokens} of "
              f"{p.prompt_tokens[1]} prompt tokens reused)."]
    ll = r.llamacpp
    if ll:
        ours = next(n for n in r.ngram if n.prompt == "summarization")
        pl, lk = ll.plain, ll.lookup
        lines.append(f"llama.cpp, same GGUF and summarization prompt ({pl.prompt_tokens} tokens, "
                     f"{ours.prompt_tokens} ours): time to first token {pl.ttft_s:.2f} s against ours "
                     f"{ours.ttft_s:.2f} s ({pl.ttft_s / ours.ttft_s:.2f}x); plain decoding "
                     f"{pl.decode_tok_s:.1f} tok/s against ours {ours.plain_tok_s:.1f}; its prompt lookup "
                     f"{lk.decode_tok_s:.1f} tok/s "
                     f"({lk.decode_tok_s / pl.decode_tok_s:.2f}x its plain), ours with n-gram "
                     f"{max(ours.k5_tok_s, ours.auto_tok_s):.1f}.")
    return "\n".join(lines + [""] + goal_lines(r, at)) + "\n"


def goal_lines(r: LongContextRun, at: dict[int, ContextPass]) -> list[str]:
    """Each of issue 13's goals, PASS or FAIL."""
    lines = []
    if 3072 in at:
        speed = at[512].step_s / at[3072].step_s
        lines.append(f"{verdict(speed >= 0.8)}: decoding at 3k runs at {speed:.0%} of its speed at 512 (goal >= 80%)")
        six = at[3072].verify_cost["6"]
        lines.append(f"{verdict(six <= 1.3)}: a 6-row verify pass at 3k costs {six:.2f} one-row passes (goal <= 1.3)")
    for n in r.ngram:
        best = max(n.k5_speedup, n.auto_speedup)
        lines.append(f"{verdict(best >= 1.5 and n.identical)}: n-gram speculation in the decode phase at 3k, "
                     f"{n.prompt}: k=5 {n.k5_speedup:.2f}x, auto {n.auto_speedup:.2f}x (goal >= 1.5x), "
                     f"output identical to plain: {n.identical}")
    for t in r.ttft:
        q = t.ttft_s / t.compute_floor_s
        lines.append(f"{verdict(q <= 1.5)}: time to first token at {t.prompt_tokens} is {q:.2f}x the compute "
                     f"floor (goal <= 1.5x)")
    if r.llamacpp:
        q = r.llamacpp.plain.ttft_s / next(n for n in r.ngram if n.prompt == "summarization").ttft_s
        lines.append(f"{verdict(q >= 2)}: time to first token {q:.2f}x faster than llama.cpp (goal >= 2x)")
    p = r.prefix
    lines.append(f"{verdict(p.ratio <= 0.1)}: the second question reaches its first token in {p.ratio:.1%} of "
                 f"the first's time (goal <= 10%)")
    return lines
