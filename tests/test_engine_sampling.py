"""Exact sampling end to end: with a draft model that disagrees with the target, the engine's speculative samples
are distributed as the target's own, checked against the exact distribution of the first generated tokens
(enumerated with the same model and the independent warping oracle); a broken verify rule must fail the same
test, and top-k / top-p warping must be applied to p and q alike."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

import specdec.sampling.rounds as rounds
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.policy import FixedK
from specdec.engine.scheduler import Scheduler, SchedulerConfig
from specdec.engine.sequence import Sequence
from specdec.sampling.warp import SamplingConfig
from tests.conftest import prefill_cache
from tests.sampler_harness import broken_no_residual, chi_square_pvalue, pooled_chi_square
from tests.warp_oracle import reference_warp_rows

VOCAB = 10
TARGET = dict(vocab=VOCAB, std=0.3)  # peaky, varied distributions
DRAFT = dict(vocab=VOCAB, std=0.3, seed=1)  # another model: q far from p, so a wrong residual shows
PROMPT = [1, 2, 3, 4]
SAMPLES = 4000  # identical prompts in one static batch
PASS_LEVEL = 1e-3  # fixed seeds: the runs are deterministic
REJECT_LEVEL = 1e-8


def exact_distribution(model, sampling: SamplingConfig, length: int) -> np.ndarray:
    """P(first `length` generated tokens) [VOCAB ** length], by enumeration with the model itself: the first
    token from the prefill (as the engine draws it), the next ones from one decode pass over every possible
    prefix (decode passes are batch-invariant, so these are exactly the distributions the engine verifies with)."""
    prefixes = torch.tensor(list(itertools.product(range(VOCAB), repeat=length - 1)))  # [V^(L-1), L-1]
    n = prefixes.shape[0]
    cache, first = prefill_cache(model, [PROMPT] * n, 64)
    joint = reference_warp_rows(first[:1], sampling)[0]  # [V]
    if length == 1:
        return joint.numpy()
    steps = reference_warp_rows(model.forward(prefixes, torch.full((n,), len(PROMPT)), cache), sampling)
    prob = joint[prefixes[:, 0]]  # [n]: P(prefix), built up position by position
    for j in range(1, length - 1):
        prob = prob * steps[torch.arange(n), j - 1, prefixes[:, j]]
    return (prob.unsqueeze(1) * steps[:, -1]).reshape(-1).numpy()  # [V^L], in product order


def goodness_of_fit(sequences: np.ndarray, expected_p: np.ndarray) -> float:
    """Chi-square p-value of observed sequences [N, L] against exact probabilities [V ** L] (see pooled_chi_square:
    a sample in a cell of probability 0 gives 0, and NaN probabilities fail the test instead of being dropped)."""
    n, length = sequences.shape
    index = (sequences * VOCAB ** np.arange(length - 1, -1, -1)).sum(axis=1)
    observed = np.bincount(index, minlength=len(expected_p)).astype(float)
    return chi_square_pvalue(*pooled_chi_square(observed, expected_p))


def sample(tiny_model, sampling: SamplingConfig, length: int, k: int | None) -> tuple[np.ndarray, float]:
    """SAMPLES runs of `length` tokens: plain (k None) or speculative with the draft model. (tokens, alpha)."""
    target = tiny_model("fp16", **TARGET)
    drafter = None if k is None else DraftModelDrafter(tiny_model("fp16", **DRAFT), VOCAB)
    # generate past `length`: the engine drafts no further than the token budget, and the first speculative round
    # must draft all k tokens
    results = Engine(target, None).generate([PROMPT] * SAMPLES, GenerationConfig(length + (k or 1), sampling),
                                            drafter, k or 1)
    tokens = np.array([r.token_ids[:length] for r in results])
    assert tokens.shape == (SAMPLES, length)
    drafted = sum(r.stats.drafted for r in results)
    return tokens, sum(r.stats.accepted for r in results) / drafted if drafted else float("nan")


@pytest.fixture(scope="module")
def exact3(tiny_model):
    return exact_distribution(tiny_model("fp16", **TARGET), SamplingConfig(temperature=1.0), 3)


def test_exact_distribution_is_a_distribution(exact3):
    assert exact3.shape == (VOCAB ** 3,) and abs(exact3.sum() - 1) < 1e-5 and exact3.max() < 0.5


def test_plain_sampling_matches_the_exact_distribution(tiny_model, exact3):
    tokens, _ = sample(tiny_model, SamplingConfig(1.0, seed=11), 3, None)
    pv = goodness_of_fit(tokens, exact3)
    print(f"plain sampling: chi-square p = {pv:.3g}")
    assert pv > PASS_LEVEL, f"plain samples fail the chi-square test: p = {pv:.2e}"


def test_speculative_sampling_matches_the_exact_distribution(tiny_model, exact3):
    """k = 3: tokens 2 and 3 come from the first speculative round, as accepted drafts or recovered tokens."""
    tokens, alpha = sample(tiny_model, SamplingConfig(1.0, seed=12), 3, 3)
    assert 0.05 < alpha < 0.9, alpha  # drafts are accepted and rejected: both paths carry weight
    pv = goodness_of_fit(tokens, exact3)
    print(f"speculative sampling, k = 3: alpha {alpha:.2f}, chi-square p = {pv:.3g}")
    assert pv > PASS_LEVEL, f"speculative samples fail the chi-square test: p = {pv:.2e}"


def test_speculative_bonus_token_matches_the_exact_distribution(tiny_model, exact3):
    """k = 1: token 3 is the bonus token whenever the one draft was accepted."""
    tokens, alpha = sample(tiny_model, SamplingConfig(1.0, seed=13), 3, 1)
    pv = goodness_of_fit(tokens, exact3)
    print(f"speculative sampling, k = 1: alpha {alpha:.2f}, chi-square p = {pv:.3g}")
    assert pv > PASS_LEVEL, f"speculative samples fail the chi-square test: p = {pv:.2e}"


def test_broken_verify_rule_fails_the_same_test(tiny_model, exact3, monkeypatch):
    """Resampling from p instead of the residual after a rejection: the same test must reject it."""
    monkeypatch.setattr(rounds, "rejection_sample", broken_no_residual)
    tokens, _ = sample(tiny_model, SamplingConfig(1.0, seed=12), 3, 3)
    pv = goodness_of_fit(tokens, exact3)
    print(f"broken rule (no residual): chi-square p = {pv:.3g}")
    assert pv < REJECT_LEVEL, f"the broken rule passed: p = {pv:.2e}"


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0, top_k=3, seed=14), SamplingConfig(1.0, top_p=0.8, seed=15)],
                         ids=["top_k=3", "top_p=0.8"])
def test_warped_speculative_sampling_matches_the_warped_target(tiny_model, sampling):
    """The first two tokens (the second is speculative) against the warped target's exact distribution: no
    token outside the kept set, and the kept ones in the right proportions."""
    exact = exact_distribution(tiny_model("fp16", **TARGET), sampling, 2)
    assert (exact > 0).sum() < VOCAB ** 2 / 3  # the warping does cut tokens
    tokens, _ = sample(tiny_model, sampling, 2, 3)
    pv = goodness_of_fit(tokens, exact)
    print(f"{sampling}: {(exact > 0).sum()} possible pairs, chi-square p = {pv:.3g}")
    assert pv > PASS_LEVEL, f"warped speculative samples fail the chi-square test: p = {pv:.2e}"


@pytest.mark.slow  # 13 s of rounds through the step loop
def test_rows_joining_mid_run_with_their_own_settings_sample_exactly(tiny_model):
    """The step loop as a server runs it: sequences arrive in waves while others are mid-generation, half at
    temperature 1 and half with top-p 0.8, each with its own seed, in ragged passes where rows verify different
    numbers of drafts. Each half's first three tokens follow its own exact distribution."""
    target = tiny_model("fp16", **TARGET)
    settings = [SamplingConfig(1.0), SamplingConfig(1.0, top_p=0.8)]
    sched = Scheduler(target, None, DraftModelDrafter(tiny_model("fp16", **DRAFT), VOCAB), FixedK(3),
                      SchedulerConfig(max_batch=SAMPLES, max_queue=None, context=32))
    seqs = [Sequence(PROMPT, GenerationConfig(3 + i % 4, replace(settings[i % 2], seed=1000 + i)), max_k=3)
            for i in range(2 * SAMPLES)]
    waves = [seqs[i::4] for i in range(4)]
    steps = 0
    for wave in waves:
        for s in wave:
            sched.admit(s)
        sched.step()  # the wave is prefilled while the earlier ones are mid-generation
        steps += 1
    while not sched.idle:
        sched.step()
        steps += 1
    drafted = [len(r.drafted) for s in seqs for r in s.stats.rounds]
    assert {0, 1, 2, 3} <= set(drafted)  # ragged: budgets cut some rows' drafts, down to none
    for j, sampling in enumerate(settings):
        tokens = np.array([s.output[:3] for s in seqs[j::2]])
        pv = goodness_of_fit(tokens, exact_distribution(target, sampling, 3))
        print(f"{sampling}, rows joining over {steps} steps: chi-square p = {pv:.3g}")
        assert pv > PASS_LEVEL, f"{sampling}: samples fail the chi-square test: p = {pv:.2e}"
