"""The rejection sampler: exact in distribution (with power against broken samplers), equal to a slow
reference loop, greedy fast path, ragged rows and the numerical edge cases; and a whole round verified in one call
equal to its rows verified one by one."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling.lossy import LossyAcceptanceWarning, verify_typical_lossy
from specdec.sampling.rounds import RowRule, draw_rows, verify_rows
from specdec.sampling.verify import (
    PAD,
    draw_random,
    rejection_sample,
    verify,
    verify_greedy,
)
from specdec.sampling.warp import SamplingConfig, warp_probs
from tests.sampler_harness import (
    broken_no_residual,
    broken_swapped_ratio,
    position_pvalues,
    random_config,
    rejection_sample_reference,
    run_rounds,
    verify_round,
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


# ---- a whole round in one call: ragged rows, each with its own rule --------------------------------------------

RULES = [RowRule(SamplingConfig(0.0)), RowRule(SamplingConfig(1.0)), RowRule(SamplingConfig(0.7, top_k=5)),
         RowRule(SamplingConfig(1.3, top_p=0.8)), RowRule(SamplingConfig(1.0, top_k=20, top_p=0.9)),
         RowRule(SamplingConfig(0.0), lossy_typical=True), RowRule(SamplingConfig(0.8), lossy_typical=True)]


def _ragged_round(seed: int, rows: int = 24, k: int = 5, vocab: int = 50, with_q: bool = True):
    """A round's inputs: drafts PAD-padded to k with every length 0..k present, q (a drafter's, or None), logits
    padded [rows, k+1, vocab] (NaN past each row's length + 1), and a rule per row, every rule present."""
    g = torch.Generator().manual_seed(seed)
    lengths = [i % (k + 1) for i in range(rows)]
    tokens = torch.full((rows, k), PAD, dtype=torch.long)  # [rows, k_max]
    q = torch.softmax(3 * torch.randn(rows, k, vocab, generator=g), -1) if with_q else None  # [rows, k_max, vocab]
    logits = 3 * torch.randn(rows, k + 1, vocab, generator=g)  # [rows, k_max+1, vocab]
    for r, n in enumerate(lengths):
        if n:
            draws = torch.multinomial(q[r, :n], 1, generator=g).view(-1) if with_q else \
                torch.randint(0, vocab, (n,), generator=g)
            # half of them the target's argmax, so that greedy rows accept some
            top = logits[r, :n].argmax(-1)
            tokens[r, :n] = torch.where(torch.rand(n, generator=g) < 0.5, top, draws)
        logits[r, n + 1:] = float("nan")
    rules = [RULES[(r * 5 + seed) % len(RULES)] for r in range(rows)]
    return tokens, q, logits, rules, lengths


def flat(logits: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """[sum(lengths + 1), vocab]: each row's live positions, row after row, as the target's ragged pass gives them."""
    return torch.cat([logits[r, :n + 1] for r, n in enumerate(lengths)])


def _one_row(tokens, q, logits, rule: RowRule, n: int, accept_u, noise):
    """The row alone (batch of 1, its own k), by the rule's own function, with its slice of the random numbers."""
    t, lg = tokens[:, :n], logits[:, :n + 1]  # [1, n], [1, n+1, vocab]
    s = rule.sampling
    if rule.lossy_typical:
        return verify_typical_lossy(t, torch.softmax(lg.float(), -1) if s.greedy else warp_probs(lg, s), noise)
    if s.greedy:
        return verify_greedy(t, lg)
    return rejection_sample(t, None if q is None else q[:, :n], warp_probs(lg, s), accept_u[:, :n], noise)


@pytest.mark.filterwarnings("ignore::specdec.sampling.lossy.LossyAcceptanceWarning")
@pytest.mark.parametrize("with_q", [True, False], ids=["q", "one-hot"])
@pytest.mark.parametrize("seed", range(4))
def test_a_round_in_one_call_equals_each_row_alone(seed, with_q):
    """Same uniforms and noise, same tokens: every row of a ragged round (k from 0 to 5, greedy, sampled with and
    without top-k/top-p, typical) verified in one call gives what verifying it alone gives."""
    tokens, q, logits, rules, lengths = _ragged_round(seed, with_q=with_q)
    g = torch.Generator().manual_seed(100 + seed)
    accept_u = torch.rand(tokens.shape, generator=g)  # [rows, k_max]
    noise = torch.empty(tokens.shape[0], logits.shape[-1]).exponential_(generator=g)  # [rows, vocab]
    out = verify_rows(tokens, q, flat(logits, lengths), rules, accept_u, noise)
    assert out.tokens.shape == (tokens.shape[0], tokens.shape[1] + 1)
    for r, (rule, n) in enumerate(zip(rules, lengths)):
        one = _one_row(tokens[r:r + 1], None if q is None else q[r:r + 1], logits[r:r + 1], rule, n,
                       accept_u[r:r + 1], noise[r:r + 1])
        a = int(one.num_accepted[0])
        assert int(out.num_accepted[r]) == a, (r, rule, n)
        assert out.tokens[r, :n + 1].tolist() == one.tokens[0].tolist(), (r, rule, n)
        assert (out.tokens[r, n + 1:] == PAD).all()
    assert {int(a) for a in out.num_accepted} > {0}  # some rows accept drafts


@pytest.mark.filterwarnings("ignore::specdec.sampling.lossy.LossyAcceptanceWarning")
@pytest.mark.parametrize("seed", range(3))
def test_each_row_draws_from_its_own_stream_as_it_would_alone(seed):
    """draw_rows + verify_rows against verify_round row by row, each row with its own generator seeded the same:
    the same tokens, and every stream left where the row alone leaves it."""
    tokens, q, logits, rules, lengths = _ragged_round(seed)
    alone = [torch.Generator().manual_seed(7 * r + seed) for r in range(len(rules))]
    together = [torch.Generator().manual_seed(7 * r + seed) for r in range(len(rules))]
    accept_u, noise = draw_rows(rules, lengths, logits.shape[-1], together)
    out = verify_rows(tokens, q, flat(logits, lengths), rules, accept_u, noise)
    for r, (rule, n) in enumerate(zip(rules, lengths)):
        one = verify_round(tokens[r:r + 1, :n], None if q is None or rule.sampling.greedy else q[r:r + 1, :n],
                           logits[r:r + 1, :n + 1], rule.sampling, alone[r], rule.lossy_typical)
        assert out.tokens[r, :n + 1].tolist() == one.tokens[0].tolist(), (r, rule, n)
        assert torch.equal(alone[r].get_state(), together[r].get_state()), r


def test_a_greedy_round_draws_nothing():
    tokens, q, logits, rules, lengths = _ragged_round(0)
    greedy = [RowRule(SamplingConfig(0.0))] * len(rules)
    gens = [torch.Generator().manual_seed(r) for r in range(len(rules))]
    assert draw_rows(greedy, lengths, logits.shape[-1], gens) == (None, None)
    out = verify_rows(tokens, q, flat(logits, lengths), greedy, None, None)
    for r, n in enumerate(lengths):
        assert out.tokens[r, :n + 1].tolist() == verify_greedy(tokens[r:r + 1, :n], logits[r:r + 1, :n + 1]).tokens[
            0].tolist()


def test_making_one_row_ragged_changes_no_other_row():
    """Six full rows, then the same round with the last row one draft shorter (its logits one position fewer):
    the other rows' tokens, read at other offsets of the flat logits, stay the same."""
    q = _ragged_round(1, rows=6, k=3)[1]  # [6, 3, 50]
    tokens = torch.randint(0, 50, (6, 3), generator=torch.Generator().manual_seed(0))
    logits = torch.randn(6, 4, 50, generator=torch.Generator().manual_seed(1))
    rules = [RowRule(SamplingConfig(0.9, top_k=10, seed=s)) for s in range(6)]
    g = torch.Generator().manual_seed(2)
    u, noise = torch.rand(6, 3, generator=g), torch.empty(6, 50).exponential_(generator=g)
    full = verify_rows(tokens, q, flat(logits, [3] * 6), rules, u, noise)
    ragged = tokens.clone()
    ragged[5, 2] = PAD
    part = verify_rows(ragged, q, flat(logits, [3] * 5 + [2]), rules, u, noise)
    assert torch.equal(full.tokens[:5], part.tokens[:5]) and torch.equal(full.num_accepted[:5], part.num_accepted[:5])
