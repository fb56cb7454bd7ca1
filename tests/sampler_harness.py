"""Shared machinery for the distributional tests: random (p, q) configurations, a round driver that drafts
from q and verifies, per-position chi-square tests, and deliberately broken samplers that they must reject."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from specdec.sampling.verify import VerifyOutput, _assemble, draw_random, rejection_sample


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


def position_pvalues(out: VerifyOutput, p: torch.Tensor, min_samples: int = 200) -> list[tuple[int, int, float]]:
    """(position, samples, chi-square p-value) for every output position with enough samples.

    Rounds that reached position j got there by acceptances that are independent of what happens at j, so
    the token at j must be distributed as p[j]. Bins with small expected counts are pooled."""
    results = []
    for j in range(out.tokens.shape[1]):
        col = out.tokens[:, j]
        col = col[col >= 0].numpy()
        n = len(col)
        if n < min_samples:
            continue
        observed = np.bincount(col, minlength=p.shape[1]).astype(float)
        expected = p[j].double().numpy() * n
        big = expected >= 5
        if observed[~big].sum() > 0 and expected[~big].sum() == 0:
            results.append((j, n, 0.0))  # mass where p has none: impossible under the target
            continue
        obs = np.append(observed[big], observed[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        keep = exp > 0
        obs, exp = obs[keep], exp[keep]
        if len(obs) < 2:
            continue
        results.append((j, n, float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)))
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
