"""The audit's statistics, as pure functions: do two samples of completions come from the same distribution?

Per prompt and token position, the generated tokens of the endpoint (row 0) and of the reference (row 1) form a
2 x B table: each token whose pooled count gives an expected count >= 5 in both rows is a bin of its own, every
other token falls into one "other" bin (a completion that ended before the position counts as the token END).
A chi-square test of homogeneity (df = B - 1) asks whether the two rows differ. The tests of one audit are
combined by Bonferroni: each runs at level alpha / m (m: the number of tests, over prompts and positions), and
the audit's p-value is min(1, m * smallest p).

Power. The smallest total-variation distance d that the audit detects with probability `power` (0.95) is
computed for each test from the noncentral chi-square distribution: when the two rows' distributions a and b
differ, the statistic is approximately ncx2(df, lam) with lam = n_eff * sum_j (a_j - b_j)^2 / pi_j, where
pi is the pooled distribution and n_eff = n_a n_b / (n_a + n_b). Among all differences of TV distance d between
the bins, the hardest to see (the least lam) moves mass d from one group of bins to the rest, in proportion to
pi within each group, with the groups as near half of the mass each: lam = n_eff d^2 (1/P + 1/(1 - P)), P the
mass of one group (>= 4 n_eff d^2). We solve for the lam that gives `power` at the test's level and report the d
it means, with pi and the bins taken from the data. Differences inside the "other" bin are invisible to the
test; so are differences in the joint distribution that leave every position's marginal unchanged.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

END = -1  # the label of a position after the completion ended
OTHER = "other"  # the bin of the tokens too rare for a bin of their own
MIN_EXPECTED = 5.0  # the smallest expected count a bin may have (the usual rule for the chi-square approximation)
POWER = 0.95


@dataclass(frozen=True)
class Table:
    labels: tuple  # [B] a token id (END included) per bin, most frequent first; OTHER last if present
    counts: np.ndarray  # [2, B] int: row 0 the endpoint, row 1 the reference


def bin_table(a: Sequence[int], b: Sequence[int], min_expected: float = MIN_EXPECTED) -> Table:
    """The 2 x B table of two samples of tokens (see the module docstring). Bins are chosen from the pooled
    counts only, so under the null hypothesis the choice favours neither sample."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    pooled = ca + cb
    share = min(na, nb) / (na + nb)  # expected count of a token in the smaller row, per pooled count
    order = sorted(pooled, key=lambda t: (-pooled[t], t))
    kept = [t for t in order if pooled[t] * share >= min_expected]
    rest = [t for t in order if pooled[t] * share < min_expected]
    if rest and sum(pooled[t] for t in rest) * share < min_expected and kept:
        rest = [kept.pop(), *rest]  # "other" too small: the smallest kept bin joins it (then it is large enough)
    rows = [[c[t] for t in kept] + ([sum(c[t] for t in rest)] if rest else []) for c in (ca, cb)]
    return Table(tuple(kept) + ((OTHER,) if rest else ()), np.array(rows, dtype=np.int64))


def chi2_homogeneity(counts: np.ndarray) -> tuple[float, int, float]:
    """(statistic, df, p) of the chi-square test of homogeneity of a [2, B] table (p = 1 when B < 2)."""
    from scipy.stats import chi2

    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape[1] < 2:
        return 0.0, 0, 1.0
    expected = counts.sum(1, keepdims=True) * counts.sum(0, keepdims=True) / counts.sum()  # [2, B]
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = counts.shape[1] - 1
    return stat, df, float(chi2.sf(stat, df))


def plugin_tv(counts: np.ndarray) -> float:
    """Total-variation distance between the two rows' empirical distributions over the bins."""
    counts = np.asarray(counts, dtype=np.float64)
    freq = counts / counts.sum(1, keepdims=True)
    return float(0.5 * np.abs(freq[0] - freq[1]).sum())


@functools.cache
def noncentrality_for_power(df: int, alpha: float, power: float = POWER) -> float:
    """The noncentrality lam at which a chi-square test with df degrees of freedom at level alpha rejects with
    probability `power`."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2

    crit = chi2.isf(alpha, df)
    hi = 1.0
    while ncx2.sf(crit, df, hi) < power:
        hi *= 2
    return float(brentq(lambda lam: ncx2.sf(crit, df, lam) - power, 0.0, hi, xtol=1e-9))


def balanced_share(pooled: Sequence[int]) -> float:
    """The mass P of the group of bins whose pooled count is nearest half the total (exact, by subset sums)."""
    total = int(sum(pooled))
    reachable = 1  # bit s set: some group of bins has pooled count s
    for c in pooled:
        reachable |= reachable << int(c)
    s = min((s for s in range(total + 1) if reachable >> s & 1), key=lambda s: abs(2 * s - total))
    return s / total


def detectable_tv(counts: np.ndarray, alpha: float, power: float = POWER) -> float:
    """The smallest TV distance between the rows' distributions that a test at level alpha detects with
    probability `power`, in the hardest direction (see the module docstring); inf when B < 2."""
    counts = np.asarray(counts)
    if counts.shape[1] < 2:
        return math.inf
    na, nb = (int(x) for x in counts.sum(1))
    n_eff = na * nb / (na + nb)
    p = balanced_share(counts.sum(0).tolist())
    lam = noncentrality_for_power(counts.shape[1] - 1, alpha, power)
    return min(1.0, math.sqrt(lam / (n_eff * (1 / p + 1 / (1 - p)))))


@dataclass(frozen=True)
class PositionTest:
    prompt: int  # index into the prompts
    position: int  # 1 = the first generated token
    n: tuple[int, int]  # completions: endpoint, reference
    bins: int
    chi2: float
    df: int
    p: float
    tv: float  # plug-in TV distance over the bins
    detectable_tv: float  # at the level this test runs at (alpha / m)
    top: tuple[tuple[object, int, int], ...]  # the 3 largest bins: (label, endpoint count, reference count)


@dataclass(frozen=True)
class AuditResult:
    verdict: str  # "lossless" | "lossy" | "mismatch" | "inconclusive"
    message: str
    p: float  # Bonferroni-adjusted (m * the smallest p of positions >= 2)
    tv: float | None  # lossy: the plug-in TV at the test with the smallest p
    detectable_tv: float | None  # the largest over the tests of positions >= 2 (None if there are none)
    alpha: float
    tests: int  # m: the tests, position 1 included (a position where one token was seen is no test)
    first_position_p: float  # Bonferroni-adjusted, over the tests of position 1 (the prompt pass)
    positions: tuple[PositionTest, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def position_labels(samples: Sequence[Sequence[int]], position: int) -> list[int]:
    """The token at `position` (1-based) of each completion, END where it ended before."""
    return [s[position - 1] if len(s) >= position else END for s in samples]


def _test(prompt: int, position: int, a: list[int], b: list[int], alpha: float) -> PositionTest:
    table = bin_table(a, b)
    stat, df, p = chi2_homogeneity(table.counts)
    top = tuple((table.labels[j], int(table.counts[0, j]), int(table.counts[1, j]))
                for j in range(min(3, len(table.labels))))
    return PositionTest(prompt, position, (len(a), len(b)), len(table.labels), stat, df, p,
                        plugin_tv(table.counts), detectable_tv(table.counts, alpha), top)


def compare(endpoint: Sequence[Sequence[Sequence[int]]], reference: Sequence[Sequence[Sequence[int]]],
            max_tokens: int, alpha: float = 0.05) -> AuditResult:
    """The audit: endpoint[i] and reference[i] are the completions (token lists) of prompt i.

    Positions 2..max_tokens are where speculation acts. Position 1 is sampled from the prompt pass by any
    speculative server, before a draft exists: a difference there says the two servers do not run the same
    model and settings ("mismatch"). All positions' tests form one Bonferroni family, so the probability of any
    verdict but "lossless" for two servers that sample alike is at most alpha."""
    if len(endpoint) != len(reference) or not endpoint:
        raise ValueError("endpoint and reference need completions of the same prompts")
    if max_tokens < 2:
        raise ValueError("at least 2 positions are needed (position 1 precedes any speculation)")
    labels = {(i, j): (position_labels(endpoint[i], j), position_labels(reference[i], j))
              for i in range(len(endpoint)) for j in range(1, max_tokens + 1)}
    varied = [key for key, (a, b) in labels.items() if len(bin_table(a, b).labels) >= 2]
    m = max(1, len(varied))  # position 1 is in the family: the audit's false-alarm rate is alpha in all
    tests = tuple(_test(i, j, *labels[(i, j)], alpha / m) for i, j in sorted(varied))
    later = [t for t in tests if t.position >= 2]
    first_p = min(1.0, m * min((t.p for t in tests if t.position == 1), default=1.0))
    if not later:
        return AuditResult("inconclusive", "inconclusive: every completion had the same token at every position "
                           "from 2 on (nothing to compare: raise the temperature or change the prompts)",
                           1.0, None, None, alpha, m, first_p, tests)
    worst = min(later, key=lambda t: t.p)
    p = min(1.0, m * worst.p)
    x = max(t.detectable_tv for t in later)
    if first_p < alpha:
        return AuditResult("mismatch", f"mismatch: the servers differ already at position 1, which comes from the "
                           f"prompt pass, before any speculation (p = {first_p:.2g}): not the same model or "
                           f"sampling settings", p, None, x, alpha, m, first_p, tests)
    if p < alpha:
        return AuditResult("lossy", f"lossy: TV ~ {worst.tv:.3f}, p = {p:.2g} (prompt {worst.prompt + 1}, "
                           f"position {worst.position})", p, worst.tv, x, alpha, m, first_p, tests)
    return AuditResult("lossless", f"consistent with lossless (would detect TV >= {x:.3f}; p = {p:.2g})",
                       p, None, x, alpha, m, first_p, tests)
