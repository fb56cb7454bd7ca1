"""A decode round's verification: every row at once, each with its own sampling settings and random stream.

One target pass scores every running row's drafts; `verify_rows` then verifies all of them in one call. Rows are
ragged: row r drafted lengths[r] tokens (0 allowed: a row decoding plainly this round), padded with PAD to the
round's widest draft, and the target's logits come flat, as its ragged pass gives them (row after row, each row's
lengths[r] + 1 positions). Each row is verified by its own rule: greedy (temperature 0), exact rejection sampling
against its warped target distribution, or (opt-in, LOSSY) typical acceptance.

`verify_rows` is a pure function of tensors with its random numbers passed in. `draw_rows` draws them from each
row's own stream exactly as verifying that row alone would (nothing at temperature 0, the noise alone for typical
acceptance, else one uniform per draft then the noise), so a row's tokens never depend on its company.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling.lossy import verify_typical_lossy
from specdec.sampling.verify import (
    PAD,
    VerifyOutput,
    argmax_rows,
    draft_lengths,
    draw_random,
    rejection_sample,
    verify_greedy,
)
from specdec.sampling.warp import SamplingConfig, warp_probs


@dataclass(frozen=True)
class RowRule:
    """How one row is verified."""

    sampling: SamplingConfig
    lossy_typical: bool = False  # LOSSY: typical acceptance instead of the exact rule

    @property
    def greedy(self) -> bool:
        """Verified by argmax alone: no random numbers."""
        return self.sampling.greedy and not self.lossy_typical


def draw_rows(rules: Sequence[RowRule], lengths: Sequence[int], vocab: int, generators: Sequence[torch.Generator],
              device="cpu") -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The round's random numbers, each row's from its own stream: acceptance uniforms [rows, max(lengths)] and
    exponential noise [rows, vocab] (ones where a row draws nothing), or (None, None) when every row is greedy."""
    if all(r.greedy for r in rules):
        return None, None
    accept_u = torch.ones((len(rules), max(lengths, default=0)), device=device)  # [rows, k_max]
    noise = torch.ones((len(rules), vocab), device=device)  # [rows, vocab]
    for i, (rule, n, g) in enumerate(zip(rules, lengths, generators)):
        if rule.greedy:
            continue
        u, noise[i:i + 1] = draw_random(1, 0 if rule.lossy_typical else n, vocab, g, device)  # [1, n], [1, vocab]
        accept_u[i, :u.shape[1]] = u[0]
    return accept_u, noise


def verify_rows(
    draft_tokens: torch.Tensor,  # [rows, k_max] long, each row's drafts PAD-padded on the right
    draft_probs: torch.Tensor | None,  # [rows, k_max, vocab] the drafter's warped q, or None (q one-hot)
    logits: torch.Tensor,  # [sum(lengths + 1), vocab] the target's, row after row: its last token, then its drafts
    rules: Sequence[RowRule],  # per row
    accept_u: torch.Tensor | None,  # [rows, k_max] uniforms (None when every row is greedy), as draw_rows gives
    noise: torch.Tensor | None,  # [rows, vocab] Exp(1) noise (None when every row is greedy)
) -> VerifyOutput:
    """Every row of a round verified by its own rule: the same tokens as verifying each row alone with its slice of
    the random numbers. The logits come flat, as the target's ragged pass gives them (lengths: each row's drafts,
    from the PAD padding); only the rows that sample are padded to [rows, k_max+1, vocab] for the sampler."""
    rows, k = draft_tokens.shape
    lengths = draft_lengths(draft_tokens).tolist()  # [rows]
    if logits.shape[0] != sum(lengths) + rows or len(rules) != rows:
        raise ValueError(f"logits must be [sum(lengths + 1)={sum(lengths) + rows}, vocab] with one rule per row, "
                         f"got {tuple(logits.shape)} and {len(rules)} rules")
    starts = [0]  # each row's first position in logits
    for n in lengths:
        starts.append(starts[-1] + n + 1)
    tokens = torch.full((rows, k + 1), PAD, dtype=torch.long, device=draft_tokens.device)  # [rows, k_max+1]
    accepted = torch.zeros(rows, dtype=torch.long, device=draft_tokens.device)  # [rows]
    for r, rule in enumerate(rules):
        if rule.greedy:  # the walk on the row's own logits (a view): nothing to pad
            n = lengths[r]
            out = verify_greedy(draft_tokens[r:r + 1, :n], logits[starts[r]:starts[r] + n + 1].unsqueeze(0))
            tokens[r, :n + 1], accepted[r] = out.tokens[0], out.num_accepted[0]
    lossy = [i for i, r in enumerate(rules) if r.lossy_typical]
    exact = [i for i, r in enumerate(rules) if not r.greedy and not r.lossy_typical]
    if lossy:  # typical acceptance reads the unwarped target at temperature 0
        p = _warped(logits, starts, lengths, k, lossy, [rules[i].sampling for i in lossy], plain_greedy=True)
        out = verify_typical_lossy(draft_tokens[lossy], p, noise[lossy])
        tokens[lossy], accepted[lossy] = out.tokens, out.num_accepted
    if exact:
        p = _warped(logits, starts, lengths, k, exact, [rules[i].sampling for i in exact])  # [m, k_max+1, vocab]
        q = None if draft_probs is None else draft_probs[exact]  # [m, k_max, vocab]
        out = rejection_sample(draft_tokens[exact], q, p, accept_u[exact], noise[exact])
        tokens[exact], accepted[exact] = out.tokens, out.num_accepted
    return VerifyOutput(tokens=tokens, num_accepted=accepted)


def _warped(logits: torch.Tensor, starts: list[int], lengths: list[int], k: int, idx: list[int],
            settings: list[SamplingConfig], plain_greedy: bool = False) -> torch.Tensor:
    """[len(idx), k+1, vocab] float: rows idx of the flat logits [sum(lengths + 1), vocab] as probabilities, each
    row warped with its settings (plain_greedy: a softmax for greedy ones) at its positions 0..lengths[r], zeros
    after. Row by row: a row's few positions stay in cache through warping's passes over the vocabulary, where the
    whole round's would not (over 49,152 tokens, 8 rows of 5 positions warp 6x faster one row at a time here)."""
    out = torch.empty((len(idx), k + 1, logits.shape[-1]), dtype=torch.float32, device=logits.device)
    for j, (r, s) in enumerate(zip(idx, settings)):
        n = lengths[r]
        x = logits[starts[r]:starts[r] + n + 1]  # [n+1, vocab]
        out[j, :n + 1] = torch.softmax(x.float(), -1) if plain_greedy and s.greedy else warp_probs(x, s)
        out[j, n + 1:] = 0.0
    return out


def sample_plain(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """One token from the (warped) target distribution. logits [vocab]."""
    if sampling.greedy:
        return argmax_rows(logits)
    probs = warp_probs(logits.view(1, -1), sampling)  # [1, vocab]
    _, noise = draw_random(1, 0, logits.shape[-1], generator, logits.device)
    return int((probs / noise).argmax(dim=-1))
