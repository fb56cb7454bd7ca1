"""Warping has oracles of its own: hand-computed cases for temperature, top-k (with ties), top-p (the crossing token
is kept, one dominant token, top-p = 1) and their composition, checked against both `warp_probs` and the
independent `reference_warp`; then properties over random distributions (Hypothesis): the warped vector is a
distribution, never NaN, and its support is what the definitions say."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.errors import SpecdecError
from specdec.sampling.warp import SamplingConfig, warp_probs
from tests.warp_oracle import reference_warp


def ln(*xs: float) -> list[float]:
    return [math.log(x) for x in xs]


def norm(*xs: float) -> list[float]:
    s = sum(xs)
    return [x / s for x in xs]


# (logits, temperature, top_k, top_p, expected distribution): every expectation worked out by hand
HAND = {
    "greedy": ([0.5, 2.0, -1.0, 2.0], 0.0, 0, 1.0, [0, 1, 0, 0]),  # ties: the first largest
    "T=1": (ln(1, 2, 4), 1.0, 0, 1.0, norm(1, 2, 4)),
    "T=2 flattens": (ln(1, 4, 16), 2.0, 0, 1.0, norm(1, 2, 4)),  # exp(ln(x) / 2) = sqrt(x)
    "T=0.5 sharpens": (ln(1, 2, 4), 0.5, 0, 1.0, norm(1, 4, 16)),
    "top-k=2": (ln(8, 1, 4, 2), 1.0, 2, 1.0, norm(8, 0, 4, 0)),
    "top-k=1": (ln(8, 1, 4, 2), 1.0, 1, 1.0, [1, 0, 0, 0]),
    "top-k ties inside": (ln(4, 4, 1, 2), 1.0, 2, 1.0, norm(4, 4, 0, 0)),
    "top-k ties at the boundary stay": (ln(8, 2, 2, 1), 1.0, 2, 1.0, norm(8, 2, 2, 0)),
    "top-k = vocab is off": (ln(8, 1, 4, 2), 1.0, 4, 1.0, norm(8, 1, 4, 2)),
    "top-k > vocab is off": (ln(8, 1, 4, 2), 1.0, 9, 1.0, norm(8, 1, 4, 2)),
    # mass before each token in order: 0, .5, .8, .95: the token crossing 0.7 (0.3) is kept
    "top-p crossing token kept": (ln(0.5, 0.3, 0.15, 0.05), 1.0, 0, 0.7, norm(0.5, 0.3, 0, 0)),
    "top-p=0.85": (ln(0.15, 0.5, 0.05, 0.3), 1.0, 0, 0.85, norm(0.15, 0.5, 0, 0.3)),
    "top-p below the top token": (ln(0.9, 0.05, 0.05), 1.0, 0, 0.5, [1, 0, 0]),
    "top-p tiny": (ln(0.4, 0.35, 0.25), 1.0, 0, 1e-6, [1, 0, 0]),
    "top-p=1 is off": (ln(0.5, 0.3, 0.15, 0.05), 1.0, 0, 1.0, norm(0.5, 0.3, 0.15, 0.05)),
    # top-k to (8, 4, 2) / 14, then mass before: 0, 8/14 = .571, 12/14 = .857: top-p 0.8 keeps two
    "T, top-k, top-p together": (ln(8, 4, 2, 1, 1), 1.0, 3, 0.8, norm(8, 4, 0, 0, 0)),
    # T = 0.5 squares: (16, 4, 1, 1); top-k 2 gives (.8, .2); top-p 0.75: the mass before the second is .8
    "T=0.5 then top-k then top-p": (ln(4, 2, 1, 1), 0.5, 2, 0.75, [1, 0, 0, 0]),
    # top-p is applied after top-k renormalises: (.5, .3) become (.625, .375), so the mass before the second token
    # is .625 >= 0.6 and it goes (measured on the full vector it would be .5 and the token would stay)
    "top-p sees the top-k renormalised mass": (ln(0.5, 0.3, 0.2), 1.0, 2, 0.6, [1, 0, 0]),
}


@pytest.mark.parametrize("case", HAND, ids=[c.replace(" ", "-") for c in HAND])
def test_hand_computed_cases(case):
    logits, t, k, p, expected = HAND[case]
    got = warp_probs(torch.tensor(logits), SamplingConfig(t, top_k=k, top_p=p))
    assert got.dtype == torch.float32 and not got.isnan().any()
    assert got.tolist() == pytest.approx(expected, abs=1e-6), case
    assert reference_warp(logits, t, k, p) == pytest.approx(expected, abs=1e-12), f"the oracle is wrong: {case}"


def test_batched_rows_are_warped_independently():
    rows = [HAND["top-k=2"], HAND["top-p crossing token kept"], HAND["top-p=1 is off"]]
    logits = torch.tensor([r[0] for r in rows])  # [3, 4]
    for cfg_row, (_, t, k, p, _) in enumerate(rows):
        got = warp_probs(logits, SamplingConfig(t, top_k=k, top_p=p))  # [3, 4]
        assert got[cfg_row].tolist() == pytest.approx(rows[cfg_row][4], abs=1e-6)
        assert torch.allclose(got.sum(-1), torch.ones(3))


def test_bad_settings_are_refused():
    for kw, needle in [(dict(temperature=-0.1), "temperature"), (dict(temperature=math.inf), "temperature"),
                       (dict(temperature=math.nan), "temperature"), (dict(top_p=0.0), "top-p"),
                       (dict(top_p=1.5), "top-p"), (dict(top_p=math.nan), "top-p"), (dict(top_k=-1), "top-k")]:
        with pytest.raises(SpecdecError, match=needle):
            SamplingConfig(**kw)


# ---- properties over random distributions ------------------------------------------------------------------

logit_vectors = st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=40)
settings_ = st.tuples(st.floats(0.05, 5.0), st.integers(0, 45), st.floats(1e-4, 1.0))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(logit_vectors, settings_)
def test_warped_vector_is_a_distribution_with_the_defined_support(logits, setting):
    t, k, p = setting
    got = warp_probs(torch.tensor(logits), SamplingConfig(t, top_k=k, top_p=p)).double()
    assert not got.isnan().any() and (got >= 0).all()
    assert abs(got.sum().item() - 1) < 1e-5
    support = got > 0
    assert support.any()

    x = torch.tensor(logits, dtype=torch.float64) / t
    # top-k: nothing below the k-th largest logit survives
    if 0 < k < len(logits):
        kth = x.sort(descending=True).values[k - 1]
        assert (x[support] >= kth - 1e-9).all()
    # within the support, probabilities are the softmax's, renormalised
    ref = torch.softmax(x, dim=0)[support]
    assert torch.allclose(got[support], ref / ref.sum(), rtol=1e-4, atol=1e-7)
    # the support is closed upwards: a kept token is at least as likely as any dropped top-k survivor
    # (a logit within 1e-9 of the k-th is a tie: float32 cannot tell them apart, e.g. 0 and 1.2e-38 / t)
    eligible = torch.ones_like(support) if not 0 < k < len(logits) else x >= kth - 1e-9
    dropped = eligible & ~support
    if dropped.any():
        assert x[support].min() >= x[dropped].max() - 1e-9
    # top-p: the support is the smallest prefix that reaches top_p (of the top-k distribution)
    if p < 1.0:
        before = torch.softmax(x.masked_fill(~eligible, -math.inf), dim=0)
        mass = before[support].sum().item()
        smallest = before[support].min().item()
        assert mass >= p - 1e-5, "the kept tokens do not reach top-p"
        assert mass - smallest < p + 1e-5, "a smaller set would reach top-p"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(logit_vectors, settings_)
def test_warp_agrees_with_the_oracle(logits, setting):
    """Away from ties at the top-p boundary (where float32 and float64 may cut differently), warp_probs equals the
    independent oracle."""
    t, k, p = setting
    ref = reference_warp(logits, t, k, p)
    if p < 1.0:  # skip settings whose top-p cut lands within float32 rounding of a boundary, or between ties
        pre = sorted(reference_warp(logits, t, k, 1.0), reverse=True)
        kept = sum(v > 0 for v in ref)
        before = sum(pre[:kept - 1])
        if abs(before - p) < 1e-4 or abs(before + pre[kept - 1] - p) < 1e-4:
            return
        if kept < len(pre) and math.isclose(pre[kept - 1], pre[kept], rel_tol=1e-5):
            return
    got = warp_probs(torch.tensor(logits), SamplingConfig(t, top_k=k, top_p=p))
    assert got.tolist() == pytest.approx(ref, abs=2e-5)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(logit_vectors)
def test_greedy_is_one_hot_on_the_first_largest(logits):
    got = warp_probs(torch.tensor(logits), SamplingConfig(0.0))
    assert got.sum().item() == 1.0 and got.max().item() == 1.0
    assert int(got.argmax()) == max(range(len(logits)), key=lambda i: (logits[i], -i))


@pytest.mark.parametrize("vocab", [10, 49152])  # thousands of rows a call, and one
def test_warp_rows_is_warp_probs_row_by_row(vocab):
    """The drafters warp a round's rows together, grouped by their rules: each row as warp_probs gives it."""
    from specdec.sampling.warp import warp_rows

    torch.manual_seed(0)
    rules = [SamplingConfig(1.3, top_k=6, top_p=0.95, seed=i) for i in range(5)] + [
        SamplingConfig(0.0), SamplingConfig(0.7, top_p=0.5), SamplingConfig(1.3, top_k=6, top_p=0.95, seed=9)]
    logits = torch.randn(len(rules), vocab) * 3
    rows = warp_rows(logits, rules)
    for i, s in enumerate(rules):
        assert torch.equal(rows[i], warp_probs(logits[i:i + 1], s)[0]), i
