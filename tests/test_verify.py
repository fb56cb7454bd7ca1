"""The rejection sampler: exact in distribution (with power against broken samplers), equal to a slow
reference loop, greedy fast path, ragged rows and the numerical edge cases."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling.lossy import LossyAcceptanceWarning, verify_typical_lossy
from specdec.sampling.verify import (
    PAD,
    draw_random,
    rejection_sample,
    rejection_sample_reference,
    verify,
    verify_greedy,
)
from tests.sampler_harness import (
    broken_no_residual,
    broken_swapped_ratio,
    position_pvalues,
    random_config,
    run_rounds,
)

ROUNDS = 100_000
# 24 configurations: k from 1 to 8, small vocabularies, every other one with q far from p.
CONFIGS = [(seed, (4, 6, 8, 12)[seed % 4], 1 + seed % 8, seed % 2 == 1) for seed in range(24)]
PASS_LEVEL = 1e-4  # per position; fixed seeds make the run deterministic
REJECT_LEVEL = 1e-6


@pytest.fixture(scope="module")
def exact_runs():
    return {cfg: run_rounds(rejection_sample, *random_config(*cfg), ROUNDS, seed=1000 + cfg[0]) for cfg in CONFIGS}


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"seed{c[0]}-V{c[1]}-k{c[2]}-{'far' if c[3] else 'near'}")
def test_every_output_position_is_distributed_as_p(cfg, exact_runs):
    p, _ = random_config(*cfg)
    results = position_pvalues(exact_runs[cfg], p)
    assert results, "no position had enough samples"
    assert results[0][1] == ROUNDS  # position 0 always has a token
    for j, n, pv in results:
        assert pv > PASS_LEVEL, f"position {j}: chi-square p = {pv:.2e} over {n} samples"


@pytest.mark.parametrize("cfg", CONFIGS[:8], ids=lambda c: f"seed{c[0]}")
def test_acceptance_at_position_0_is_sum_of_min_p_q(cfg, exact_runs):
    p, q = random_config(*cfg)
    expected = torch.minimum(p[0], q[0]).sum().item()
    measured = (exact_runs[cfg].num_accepted >= 1).double().mean().item()
    se = (expected * (1 - expected) / ROUNDS) ** 0.5
    assert abs(measured - expected) < 5 * se + 1e-9, (measured, expected)


@pytest.mark.parametrize("broken", [broken_no_residual, broken_swapped_ratio])
def test_broken_samplers_are_rejected(broken):
    """The same tests have power: a sampler with a plausible bug fails them on the far configurations."""
    rejected = 0
    far = [cfg for cfg in CONFIGS if cfg[3]]
    for cfg in far:
        p, q = random_config(*cfg)
        out = run_rounds(broken, p, q, ROUNDS, seed=1000 + cfg[0])
        if min(pv for _, _, pv in position_pvalues(out, p)) < REJECT_LEVEL:
            rejected += 1
    assert rejected == len(far), f"{broken.__name__} rejected in only {rejected}/{len(far)} configurations"


def _random_case(seed: int, b: int = 64, k: int = 6, vocab: int = 10, deterministic: bool = False):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(b, k + 1, vocab, generator=g) * 2, dim=2)
    draft = None if deterministic else torch.softmax(torch.randn(b, k, vocab, generator=g) * 2, dim=2)
    tokens = torch.randint(0, vocab, (b, k), generator=g)
    lengths = torch.randint(0, k + 1, (b,), generator=g)  # ragged: some rows draft nothing
    tokens[torch.arange(k).unsqueeze(0) >= lengths.unsqueeze(1)] = PAD
    if draft is not None:  # a few drafted tokens the drafter gave zero probability, and a few p == q rows
        draft[0, 0] = 0.0
        draft[0, 0, 3] = 1.0
        tokens[0, 0] = 5
        draft[1] = target[1, :k]
    u, noise = draw_random(b, k, vocab, g, "cpu")
    return tokens, draft, target, u, noise


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("deterministic", [False, True])
def test_vectorised_equals_reference_loop(seed, deterministic):
    case = _random_case(seed, deterministic=deterministic)
    fast = rejection_sample(*case)
    slow = rejection_sample_reference(*case)
    assert torch.equal(fast.tokens, slow.tokens)
    assert torch.equal(fast.num_accepted, slow.num_accepted)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_path_equals_sampler_on_one_hot_targets(seed):
    tokens, draft, target, u, noise = _random_case(seed)
    logits = torch.randn(target.shape, generator=torch.Generator().manual_seed(seed))
    # make the argmax agree with some drafts so that prefixes get accepted
    valid = tokens >= 0
    rows, cols = valid.nonzero(as_tuple=True)
    keep = (rows + cols) % 3 != 0
    logits[rows[keep], cols[keep], tokens[rows[keep], cols[keep]]] = 50.0
    one_hot = torch.nn.functional.one_hot(logits.argmax(2), target.shape[2]).float()
    greedy = verify_greedy(tokens, logits)
    for d in (draft, None):
        exact = rejection_sample(tokens, d, one_hot, u, noise)
        assert torch.equal(greedy.tokens, exact.tokens)
        assert torch.equal(greedy.num_accepted, exact.num_accepted)
    assert greedy.num_accepted.sum() > 0


def test_output_layout():
    """Accepted prefix, then exactly one target token, then PAD."""
    out = verify(*_random_case(3)[:3], generator=torch.Generator().manual_seed(0))
    b, k1 = out.tokens.shape
    for r in range(b):
        n = int(out.num_accepted[r])
        assert (out.tokens[r, : n + 1] >= 0).all()
        assert (out.tokens[r, n + 1:] == PAD).all()


def test_zero_draft_probability_is_accepted_when_target_allows_it():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])  # [1, 2, 3]
    q = torch.tensor([[[1.0, 0.0, 0.0]]])  # drafted token 1 has q = 0
    out = verify(torch.tensor([[1]]), q, p, generator=torch.Generator().manual_seed(0))
    assert out.num_accepted.item() == 1 and out.tokens[0, 0].item() == 1


def test_zero_target_probability_is_always_rejected():
    p = torch.tensor([[[0.0, 1.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]])
    for seed in range(50):
        out = verify(torch.tensor([[0]]), None, p, generator=torch.Generator().manual_seed(seed))
        assert out.num_accepted.item() == 0 and out.tokens[0, 0].item() == 1


def test_p_equal_q_always_accepts_and_never_samples_the_empty_residual():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2000, 5, 7, generator=g), dim=2)
    q = p[:, :4].clone()
    tokens = torch.multinomial(q.reshape(-1, 7), 1, generator=g).view(2000, 4)
    out = verify(tokens, q, p, generator=g)
    assert (out.num_accepted == 4).all()
    assert (out.tokens >= 0).all()


def test_rows_with_nothing_drafted_get_one_token_from_p():
    p = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]).repeat(3, 1, 1)  # [3, 3, 3]
    tokens = torch.tensor([[PAD, PAD], [2, PAD], [2, 0]])
    out = verify(tokens, None, p, generator=torch.Generator().manual_seed(0))
    assert out.num_accepted.tolist() == [0, 1, 2]
    assert out.tokens.tolist() == [[2, PAD, PAD], [2, 0, PAD], [2, 0, 1]]
    empty = verify(torch.empty(2, 0, dtype=torch.long), None, p[:2, :1], generator=torch.Generator())
    assert empty.tokens.tolist() == [[2], [2]] and empty.num_accepted.tolist() == [0, 0]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.zeros(1, 2, dtype=torch.long), None, torch.zeros(1, 2, 4))


def test_typical_acceptance_is_lossy_warns_and_is_measurably_off():
    """A flat-ish target and a drafter that always proposes its second choice: typical acceptance keeps it,
    so token 1 is over-represented; the total variation distance from p is far from 0."""
    p = torch.tensor([0.4, 0.35, 0.25])
    rounds = 20_000
    target = p.expand(rounds, 2, 3)
    tokens = torch.ones(rounds, 1, dtype=torch.long)
    _, noise = draw_random(rounds, 1, 3, torch.Generator().manual_seed(0), "cpu")
    with pytest.warns(LossyAcceptanceWarning):
        lossy = verify_typical_lossy(tokens, target, noise)
    freq = torch.bincount(lossy.tokens[:, 0], minlength=3).double() / rounds
    tv_lossy = 0.5 * (freq - p.double()).abs().sum().item()
    exact = verify(tokens, None, target, generator=torch.Generator().manual_seed(0))
    freq_exact = torch.bincount(exact.tokens[:, 0], minlength=3).double() / rounds
    tv_exact = 0.5 * (freq_exact - p.double()).abs().sum().item()
    assert tv_lossy > 0.3, tv_lossy  # it always keeps token 1
    assert tv_exact < 0.02, tv_exact


def test_argmax_rows_is_torch_argmax_with_its_tie_and_nan_rules():
    from specdec.sampling.verify import argmax_rows

    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [nan, 5.0, nan, 1.0], [0.0, inf, inf, 1.0], [-inf] * 4])
    assert argmax_rows(x) == x.argmax(-1).tolist() == [1, 0, 1, 0]
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, 5, 3001, generator=g)
    y[..., 100] = y[..., 2000] = 10.0  # a tie far apart
    assert argmax_rows(y) == y.argmax(-1).tolist()
    assert argmax_rows(y.half()) == y.half().argmax(-1).tolist()  # other dtypes: torch itself
    assert argmax_rows(y[0, 0]) == 100  # one row: an int
