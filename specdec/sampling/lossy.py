"""LOSSY acceptance rules. Their output is NOT distributed as the target's: opt-in only, and they warn.

Typical acceptance (Medusa): accept drafted token x while p(x) > min(threshold, alpha * exp(-H(p))), where H
is the entropy of p at that position; at the first failure draw one token from p. It accepts more than the
exact rule on flat distributions, at the price of changing what the model would have said.
"""

from __future__ import annotations

import warnings

import torch

from specdec.sampling.verify import VerifyOutput, _assemble


class LossyAcceptanceWarning(UserWarning):
    """Emitted whenever a lossy acceptance rule runs."""


def verify_typical_lossy(
    draft_tokens: torch.Tensor,  # [batch, k] long, PAD-padded
    target_probs: torch.Tensor,  # [batch, k+1, vocab]
    sample_noise: torch.Tensor,  # [batch, vocab] Exp(1)
    threshold: float = 0.09,
    alpha: float = 0.3,
) -> VerifyOutput:
    warnings.warn("typical acceptance is LOSSY: the output is not distributed as the target model's",
                  LossyAcceptanceWarning, stacklevel=2)
    b, k = draft_tokens.shape
    rows = torch.arange(b)
    valid = draft_tokens >= 0  # [batch, k]
    p = target_probs[:, :k]  # [batch, k, vocab]
    p_tok = p.gather(2, draft_tokens.clamp(min=0).unsqueeze(2)).squeeze(2)  # [batch, k]
    entropy = -(p * p.clamp(min=1e-30).log()).sum(dim=2)  # [batch, k]
    bar = torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))  # [batch, k]
    accept = (p_tok > bar) & valid  # [batch, k]
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [batch]
    final = (target_probs[rows, num_accepted] / sample_noise).argmax(dim=1)  # [batch]
    return VerifyOutput(tokens=_assemble(draft_tokens, num_accepted, final), num_accepted=num_accepted)
