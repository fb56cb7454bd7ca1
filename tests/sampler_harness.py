"""Shared machinery for the distributional tests: random (p, q) configurations, a round driver that drafts
from q and verifies, per-position chi-square tests, and deliberately broken samplers that they must reject."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from specdec.sampling.rounds import RowRule, draft_lengths, verify_rows
from specdec.sampling.verify import PAD, VerifyOutput, _assemble, _check_shapes, draw_random, rejection_sample
from specdec.sampling.warp import SamplingConfig


def random_config(seed: int, vocab: int, k: int, far: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position target p [k+1, vocab] and draft q [k, vocab]. `far` makes q concentrate where p is small."""
    g = torch.Generator().manual_seed(seed)
    p = _dirichlet(g, k + 1, vocab)
    if far:
        q = _dirichlet(g, k, vocab, conc=0.3)
        q = 0.2 * q + 0.8 * torch.softmax(-8 * p[:k], dim=1)  # mass where p is low
    else:
        q = 0.7 * p[:k] + 0.3 * _dirichlet(g, k, vocab)
    return p, q / q.sum(dim=1, keepdim=True)


def _dirichlet(g: torch.Generator, n: int, vocab: int, conc: float = 1.0) -> torch.Tensor:
    """Random distributions [n, vocab]; conc < 1 makes them peakier (not exactly Dirichlet; it need not be)."""
    x = (-torch.log(torch.rand((n, vocab), generator=g))) ** (1 / conc)
    return x / x.sum(dim=1, keepdim=True)


def run_rounds(sampler, p: torch.Tensor, q: torch.Tensor, rounds: int, seed: int) -> VerifyOutput:
    """`rounds` independent rounds: draft k tokens from q per position, verify against p."""
    k1, vocab = p.shape
    k = k1 - 1
    g = torch.Generator().manual_seed(seed)
    draft_probs = q.unsqueeze(0).expand(rounds, k, vocab)  # [rounds, k, vocab]
    target_probs = p.unsqueeze(0).expand(rounds, k + 1, vocab)  # [rounds, k+1, vocab]
    draft_tokens = torch.multinomial(q, rounds, replacement=True, generator=g).T.contiguous()  # [rounds, k]
    accept_u, noise = draw_random(rounds, k, vocab, g, "cpu")
    return sampler(draft_tokens, draft_probs, target_probs, accept_u, noise)


def pooled_chi_square(observed: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(Pearson statistic, degrees of freedom) of counts `observed` [cells] against probabilities `probs` [cells].

    Cells with an expected count below 5 are pooled into one. A sample in a cell of probability 0 is impossible
    under `probs`: the statistic is infinite. Probabilities that are NaN, negative or do not sum to 1 are a bug in
    the test's oracle, never a pass."""
    probs = np.asarray(probs, dtype=float)
    if not np.isfinite(probs).all() or (probs < 0).any() or abs(probs.sum() - 1) > 1e-6:
        raise AssertionError(f"expected probabilities are not a distribution: {probs}")
    n = observed.sum()
    if observed[probs == 0].sum() > 0:
        return math.inf, 1
    expected = probs * n
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def chi_square_pvalue(statistic: float, dof: int) -> float:
    if math.isinf(statistic):
        return 0.0
    return float(stats.chi2.sf(statistic, dof)) if dof > 0 else 1.0


def position_pvalues(out: VerifyOutput, p: torch.Tensor, min_samples: int = 200) -> list[tuple[int, int, float]]:
    """(position, samples, chi-square p-value) for every output position with enough samples.

    Rounds that reached position j got there by acceptances that are independent of what happens at j, so
    the token at j must be distributed as p[j]."""
    results = []
    for j in range(out.tokens.shape[1]):
        col = out.tokens[:, j]
        col = col[col >= 0].numpy()
        if len(col) < min_samples:
            continue
        stat, dof = pooled_chi_square(np.bincount(col, minlength=p.shape[1]).astype(float), p[j].double().numpy())
        results.append((j, len(col), chi_square_pvalue(stat, dof)))
    return results


def conditional_pvalues(tokens: torch.Tensor, exact, min_samples: int = 200) -> list[tuple[int, int, float]]:
    """(position, samples, p-value) per position of sequences tokens [N, L] (PAD after a row's end).

    The token at position j, among the rows that reached it with prefix y, must follow exact(y) (a distribution
    over the vocabulary for the prefix tuple y): one chi-square per prefix, summed over prefixes (statistics and
    degrees of freedom add for independent groups)."""
    results = []
    for j in range(tokens.shape[1]):
        reached = tokens[:, j] >= 0
        rows = tokens[reached, : j + 1].numpy()
        if len(rows) < min_samples:
            continue
        total, dof = 0.0, 0
        prefixes, group = np.unique(rows[:, :j], axis=0, return_inverse=True)
        for g, prefix in enumerate(prefixes):
            probs = np.asarray(exact(tuple(int(t) for t in prefix)), dtype=float)
            observed = np.bincount(rows[group.reshape(-1) == g, j], minlength=len(probs)).astype(float)
            stat, d = pooled_chi_square(observed, probs)
            total, dof = total + stat, dof + d
        results.append((j, len(rows), chi_square_pvalue(total, dof)))
    return results


# --- Deliberately broken samplers: the tests must reject them ------------------------------------------


def broken_no_residual(draft_tokens, draft_probs, target_probs, accept_u, sample_noise) -> VerifyOutput:
    """Rejects correctly but then resamples from p instead of norm(max(0, p - q))."""
    out = rejection_sample(draft_tokens, draft_probs, target_probs, accept_u, sample_noise)
    rows = torch.arange(draft_tokens.shape[0])
    final = (target_probs[rows, out.num_accepted] / sample_noise).argmax(dim=1)
    return VerifyOutput(_assemble(draft_tokens, out.num_accepted, final), out.num_accepted)


def broken_swapped_ratio(draft_tokens, draft_probs, target_probs, accept_u, sample_noise) -> VerifyOutput:
    """Swaps p and q in the acceptance ratio (accepts with min(1, q/p)); the residual is left intact."""
    b, k = draft_tokens.shape
    p_tok = target_probs[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
    q_tok = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)
    accept = accept_u * p_tok < q_tok
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(b)
    p_at = target_probs[rows, num_accepted]
    q_at = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)[rows, num_accepted]
    residual = (p_at - q_at).clamp(min=0)
    w = torch.where((num_accepted == k).unsqueeze(1) | (residual.sum(1, keepdim=True) <= 0), p_at, residual)
    final = (w / sample_noise).argmax(dim=1)
    return VerifyOutput(_assemble(draft_tokens, num_accepted, final), num_accepted)


def verify_round(
    tokens: torch.Tensor,  # [B, k] long, PAD-padded drafts
    draft_probs: torch.Tensor | None,  # [B, k, vocab] the drafter's warped q, or None (q one-hot)
    logits: torch.Tensor,  # [B, k+1, vocab] the target's logits over the last token and the drafts
    sampling: SamplingConfig,
    generator: torch.Generator,
    lossy_typical: bool = False,
) -> VerifyOutput:
    """Rows with one set of sampling settings and one random stream (drawn for all rows at once): greedy, exact
    rejection sampling against the warped target, or (opt-in, LOSSY) typical acceptance."""
    b, k = tokens.shape
    rule = RowRule(sampling, lossy_typical)
    accept_u = noise = None
    if lossy_typical:
        _, noise = draw_random(b, 0, logits.shape[-1], generator, logits.device)
    elif not sampling.greedy:
        accept_u, noise = draw_random(b, k, logits.shape[-1], generator, logits.device)
    live = torch.arange(k + 1, device=tokens.device)[None, :] <= draft_lengths(tokens)[:, None]  # [B, k+1]
    return verify_rows(tokens, draft_probs, logits[live], [rule] * b, accept_u, noise)  # logits flat


def rejection_sample_reference(draft_tokens, draft_probs, target_probs, accept_u, sample_noise) -> VerifyOutput:
    """The slow, obviously correct loop that `rejection_sample` must equal, token for token."""
    b, k, vocab = _check_shapes(draft_tokens, draft_probs, target_probs)
    tokens = torch.full((b, k + 1), PAD, dtype=torch.long)
    num_accepted = torch.zeros(b, dtype=torch.long)
    for r in range(b):
        drafted = [int(t) for t in draft_tokens[r] if t >= 0]
        for i, x in enumerate(drafted):
            p = target_probs[r, i]
            q = draft_probs[r, i] if draft_probs is not None else torch.nn.functional.one_hot(
                torch.tensor(x), vocab).to(p.dtype)
            if accept_u[r, i] * q[x] < p[x]:
                tokens[r, i] = x
                num_accepted[r] += 1
                continue
            residual = torch.clamp(p - q, min=0.0)
            w = residual if residual.sum() > 0 else p
            tokens[r, i] = int(torch.argmax(w / sample_noise[r]))
            break
        else:
            n = len(drafted)
            tokens[r, n] = int(torch.argmax(target_probs[r, n] / sample_noise[r]))
    return VerifyOutput(tokens=tokens, num_accepted=num_accepted)
