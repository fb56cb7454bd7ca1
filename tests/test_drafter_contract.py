"""The contract of a drafter that returns probabilities, and exactness with the power to see a wrong q.

A drafter that gives q must (1) draw its tokens from the q it reports, and (2) report the warped draft
distribution: zero wherever warping cuts a token. A wrong (1) breaks exactness quietly; a wrong (2) loses
acceptance quietly. Both are tested for every drafter in PROB_DRAFTERS, on 10^5 batched rounds from one context
over a vocabulary of 10, where the target's exact distributions are enumerated with the warping oracle: every
round's output tokens, position by position and prefix by prefix, must follow them (the engine's own
verification, `verify_round`, decides each round). Deliberately broken drafters must fail: one that reports a q
moved by 0.01 in total variation from the q it samples, one that samples the warped q but reports the unwarped
one, and one that never warps.

And every drafter declares the capabilities the step loop reads (drafters/base.py): set by the drafter itself, of
the declared type, and saying what the drafter does.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from scipy import stats

import specdec.drafters
from specdec.drafters.base import CAPABILITIES, Drafter, NoDrafter
from specdec.drafters.cascade import CascadeDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.heads.eagle import HeadConfig, default_taps
from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig, warp_rows
from specdec.train.distill import init_head
from tests.sampler_harness import chi_square_pvalue, conditional_pvalues, pooled_chi_square, verify_round
from tests.warp_oracle import reference_warp_rows

VOCAB = 10
TARGET = dict(vocab=VOCAB, std=0.3)  # peaky, varied distributions (as in test_engine_sampling)
DRAFT = dict(vocab=VOCAB, std=0.3, seed=1)  # another model: q far from p
CONTEXT = [3]  # one token: no prefill, so 10^5 rounds cost a few target passes over 10^5 rows
K = 2
ROUNDS = 100_000
CHUNK = 20_000  # rows per batch (two KV caches of 640 MB each)
SAMPLING = SamplingConfig(1.3, top_k=6, top_p=0.95)  # all three warps cut or reshape here
PASS_LEVEL = 1e-3  # fixed seeds: the runs are deterministic
REJECT_LEVEL = 1e-6


@dataclass
class ProbDrafter:
    """A drafter that returns probabilities, and how to compute, independently, the logits its q must warp."""

    make: Callable[[object], object]  # tiny_model factory -> a fresh drafter
    draft_logits: Callable[[object, list[list[int]]], torch.Tensor]  # (tiny_model, contexts [n, L]) -> [n, vocab]


def _draft_model_logits(tiny_model, contexts):
    model = tiny_model("fp16", **DRAFT)
    tokens = torch.tensor(contexts)  # [n, L]
    cache = model.new_cache(len(contexts), tokens.shape[1] + 1)
    return model.forward(tokens, torch.zeros(len(contexts), dtype=torch.long), cache)[:, -1]  # [n, vocab]


_HEADS: dict = {}


def _eagle_head(tiny_model):
    """An (untrained) EAGLE-3 head for the target over 8 of its 10 tokens, made once."""
    if "head" not in _HEADS:
        model = tiny_model("fp16", **TARGET)
        torch.manual_seed(5)
        cfg = HeadConfig.for_target(model.cfg, 8, default_taps(model.cfg.num_layers))
        _HEADS["head"] = init_head(cfg, model, torch.tensor([0, 1, 2, 3, 5, 6, 7, 9])).eval()
    return _HEADS["head"]


def _eagle_logits(tiny_model, contexts):
    """The head's logits after each context, through its training path (`unrolled`): the context's first token
    is a head position fed with zero features (none arrive outside the engine), each later token one drafting
    step. Tokens outside its vocabulary get -inf. [n, vocab]"""
    head, embed = _eagle_head(tiny_model), tiny_model("fp16", **TARGET).embed
    out = torch.full((len(contexts), VOCAB), float("-inf"))
    with torch.no_grad():
        for r, ctx in enumerate(contexts):
            emb = embed[torch.tensor(ctx)].unsqueeze(0)  # [1, steps, hidden]
            feats = torch.zeros(1, len(head.cfg.taps) * head.cfg.hidden)
            out[r, head.target_ids()] = head.unrolled(emb, feats, len(ctx))[-1][0]
    return out


PROB_DRAFTERS = {
    "draft-model": ProbDrafter(lambda tm: DraftModelDrafter(tm("fp16", **DRAFT), VOCAB), _draft_model_logits),
    "eagle": ProbDrafter(lambda tm: EagleDrafter(_eagle_head(tm), tm("fp16", **TARGET).embed), _eagle_logits),
}


# ---- deliberately broken drafters --------------------------------------------------------------------------

class ShiftedQ(DraftModelDrafter):
    """Samples from the right q but reports one with 0.01 of mass moved from its most to its second most likely
    token: total variation 0.01 between what it samples and what it reports."""

    SHIFT = 0.01

    @classmethod
    def shift(cls, q: torch.Tensor) -> torch.Tensor:
        """q [..., vocab] with SHIFT moved from each row's most likely token to its second."""
        top2 = q.topk(2, dim=-1).indices  # [..., 2]
        step = torch.tensor([-cls.SHIFT, cls.SHIFT], dtype=q.dtype).expand(top2.shape).contiguous()
        return q.clone().scatter_add_(-1, top2, step)

    def propose(self, slots, contexts, ks):
        draft = super().propose(slots, contexts, ks)
        draft.probs = self.shift(draft.probs)  # [n, k, vocab]
        return draft


class ReportsUnwarpedQ(DraftModelDrafter):
    """Samples from the warped q but reports the unwarped softmax."""

    def _probs(self, logits, settings):
        return torch.softmax(logits.float(), dim=-1)

    def _pick(self, q, slots):
        # log-softmax warps exactly as the logits do
        return super()._pick(warp_rows(q.log(), [self.sampling[s] for s in slots]), slots)


class NeverWarps(DraftModelDrafter):
    """Samples and reports the unwarped softmax: exact, but q puts mass where the warped target has none."""

    def _probs(self, logits, settings):
        return torch.softmax(logits.float(), dim=-1)


def open_slots(drafter, n: int, capacity: int, sampling: SamplingConfig, reserve: bool = True) -> list[int]:
    """Slots 0..n-1, each a sequence at CONTEXT with its own stream: slot i seeded with sampling.seed + i (as the
    engine seeds row r with seed + r), so the rows draw independently. reserve=False reuses the drafter's cache
    (at least n slots of `capacity`), as the engine reuses a slot after its last sequence closed."""
    if reserve:
        drafter.reserve(n, capacity)
    for slot in range(n):
        drafter.open(slot, CONTEXT, replace(sampling, seed=sampling.seed + slot))
    return list(range(n))


# ---- batched rounds ----------------------------------------------------------------------------------------

@dataclass
class Rounds:
    out: torch.Tensor  # [N, K+1] tokens the rounds yielded, PAD after each round's last
    drafts: torch.Tensor  # [N, K] drafted tokens
    q: torch.Tensor  # [N, K, vocab] the q the drafter reported


def run_rounds(target, drafter, rounds: int, seed: int, sampling: SamplingConfig = SAMPLING) -> Rounds:
    """`rounds` independent rounds from CONTEXT: draft K tokens, one target pass over them, the engine's
    verification."""
    outs, drafts, qs = [], [], []
    capacity, rows = len(CONTEXT) + K + 1, min(CHUNK, rounds)
    drafter.reserve(rows, capacity)  # both caches made once (zeroing 10^5 rows' caches costs more than drafting)
    cache = target.new_cache(rows, capacity)  # each chunk writes every position it reads
    for c, start in enumerate(range(0, rounds, CHUNK)):
        m = min(CHUNK, rounds - start)
        contexts = [CONTEXT] * m
        # every row its own stream; chunk c's seeds follow chunk c-1's, so no two rows of a run share one
        slots = open_slots(drafter, m, capacity, replace(sampling, seed=seed * ROUNDS + start), reserve=False)
        draft = drafter.propose(slots, contexts, [K] * m)
        assert draft.probs is not None and draft.probs.shape == (m, K, VOCAB)
        step_in = torch.cat([torch.full((m, 1), CONTEXT[-1]), draft.tokens.clamp(min=0)], dim=1)  # [m, K+1]
        pass_cache = cache if m == rows else target.new_cache(m, capacity)  # a last, shorter chunk
        logits = target.forward(step_in, torch.full((m,), len(CONTEXT) - 1), pass_cache)  # [m, K+1, vocab]
        gen = torch.Generator().manual_seed(10_000 + seed + c)
        outs.append(verify_round(draft.tokens, draft.probs, logits, sampling, gen).tokens)
        drafts.append(draft.tokens)
        qs.append(draft.probs)
    return Rounds(torch.cat(outs), torch.cat(drafts), torch.cat(qs))


def target_oracle(target, sampling: SamplingConfig = SAMPLING):
    """exact(prefix) -> the warped target distribution after CONTEXT + prefix, for every prefix of length <= K,
    from one pass over all VOCAB^K continuations and the warping oracle."""
    rows = torch.cartesian_prod(*[torch.arange(VOCAB)] * K) if K > 1 else torch.arange(VOCAB).view(-1, 1)
    n = rows.shape[0]
    tokens = torch.cat([torch.tensor(CONTEXT).expand(n, -1), rows], dim=1)  # [n, L+K]
    logits = target.forward(tokens, torch.zeros(n, dtype=torch.long), target.new_cache(n, tokens.shape[1]))
    probs = reference_warp_rows(logits[:, len(CONTEXT) - 1:], sampling)  # [n, K+1, vocab]
    index = {tuple(r.tolist()): i for i, r in enumerate(rows)}

    def exact(prefix: tuple) -> np.ndarray:
        full = prefix + (0,) * (K - len(prefix))
        return probs[index[full], len(prefix)].numpy()

    return exact


def exactness_pvalues(target, r: Rounds) -> list[tuple[int, int, float]]:
    return conditional_pvalues(r.out, target_oracle(target))


def draws_follow_q_pvalues(r: Rounds) -> list[tuple[int, float]]:
    """(position, p-value): among rounds with the same earlier drafts, the drafted tokens at position i against
    the sum of the q rows the drafter reported for them (rows with one context and prefix report one q)."""
    results = []
    for i in range(K):
        total, dof = 0.0, 0
        prefixes, group = np.unique(r.drafts[:, :i].numpy(), axis=0, return_inverse=True)
        for g in range(len(prefixes)):
            sel = torch.from_numpy(group.reshape(-1) == g)
            q = r.q[sel, i].double()  # [n_g, vocab]
            observed = np.bincount(r.drafts[sel, i].numpy(), minlength=VOCAB).astype(float)
            stat, d = pooled_chi_square(observed, (q.sum(0) / q.sum()).numpy())
            total, dof = total + stat, dof + d
        results.append((i, chi_square_pvalue(total, dof)))
    return results


def q_support_mismatch(tiny_model, spec: ProbDrafter, drafter, sampling: SamplingConfig) -> str | None:
    """Where the reported q differs from the warped draft distribution (oracle-warped logits computed apart from
    the drafter): None when they agree, else a message. Checked at the first position and, for every first token,
    at the second."""
    contexts = [CONTEXT] * VOCAB
    slots = open_slots(drafter, VOCAB, len(CONTEXT) + K + 1, sampling)  # rows draw apart: varied first tokens
    draft = drafter.propose(slots, contexts, [K] * VOCAB)
    got = [draft.probs[0, 0]] + [draft.probs[r, 1] for r in range(VOCAB)]  # [vocab] each
    ctxs = [CONTEXT] + [CONTEXT + [int(draft.tokens[r, 0])] for r in range(VOCAB)]
    want = [reference_warp_rows(spec.draft_logits(tiny_model, [c]), sampling)[0] for c in ctxs]
    for ctx, q, w in zip(ctxs, got, want):
        q = q.double()
        if not torch.equal(q > 0, w > 0):
            where = lambda x: (x > 0).nonzero().view(-1).tolist()
            return f"after {ctx}: q > 0 at {where(q)}, the warped draft distribution at {where(w)}"
        if not torch.allclose(q, w, atol=1e-5):
            return f"after {ctx}: q differs from the warped draft distribution by {(q - w).abs().max():.3g}"
    return None


# ---- the contract, for every drafter that returns probabilities --------------------------------------------

@pytest.fixture(scope="module")
def target(tiny_model):
    return tiny_model("fp16", **TARGET)


@pytest.fixture(scope="module")
def rounds(tiny_model, target):
    return {name: run_rounds(target, spec.make(tiny_model), ROUNDS, seed=1) for name, spec in PROB_DRAFTERS.items()}


@pytest.mark.slow  # the 10^5 rounds of each drafter (about 3 minutes on 2 cores)
@pytest.mark.parametrize("name", PROB_DRAFTERS)
def test_drafted_tokens_follow_the_reported_q(rounds, name):
    for i, pv in draws_follow_q_pvalues(rounds[name]):
        assert pv > PASS_LEVEL, f"{name}: drafted tokens at position {i} do not follow the reported q (p = {pv:.2e})"


@pytest.mark.parametrize("sampling", [SAMPLING, SamplingConfig(0.7), SamplingConfig(1.0, top_k=3),
                                      SamplingConfig(1.0, top_p=0.8)], ids=str)
@pytest.mark.parametrize("name", PROB_DRAFTERS)
def test_q_is_the_warped_draft_distribution(tiny_model, name, sampling):
    spec = PROB_DRAFTERS[name]
    problem = q_support_mismatch(tiny_model, spec, spec.make(tiny_model), SamplingConfig(
        sampling.temperature, sampling.top_k, sampling.top_p, seed=5))
    assert problem is None, f"{name}: {problem}"


@pytest.mark.slow  # the 10^5 rounds of each drafter (about 3 minutes on 2 cores)
@pytest.mark.parametrize("name", PROB_DRAFTERS)
def test_speculative_rounds_are_exact(target, rounds, name):
    r = rounds[name]
    accepted = (r.out[:, 0] == r.drafts[:, 0]).float().mean().item()
    assert 0.1 < accepted < 0.9, accepted  # acceptance and rejection both carry weight
    results = exactness_pvalues(target, r)
    assert [j for j, _, _ in results] == list(range(K + 1)), results  # every position has samples
    for j, n, pv in results:
        print(f"{name}: position {j}, {n} samples, chi-square p = {pv:.3g}")
        assert pv > PASS_LEVEL, f"{name}: output position {j} is not the target's distribution (p = {pv:.2e})"


# ---- the same tests fail on broken drafters ----------------------------------------------------------------

def output_distribution(p: torch.Tensor, q_sampled: torch.Tensor, q_reported: torch.Tensor) -> torch.Tensor:
    """The exact distribution of a round's first token when drafts come from q_sampled but are verified
    against q_reported: accepted drafts plus the residual of the reported q after a rejection."""
    accept = torch.where(q_reported > 0, (p / q_reported).clamp(max=1.0), torch.ones_like(p))
    kept = q_sampled * accept
    residual = (p - q_reported).clamp(min=0)
    return kept + (1 - kept.sum()) * residual / residual.sum()


@pytest.mark.slow  # 46 s
def test_the_exactness_test_has_power_against_a_q_off_by_0_01(tiny_model, target):
    """At ROUNDS samples the chi-square at the first position alone rejects the 0.01 shift at REJECT_LEVEL with
    probability >= 0.95 (non-central chi-square with the shift's exact effect on the output), and it does."""
    exact = target_oracle(target)
    p = torch.from_numpy(exact(())).double()
    q = reference_warp_rows(_draft_model_logits(tiny_model, [CONTEXT]), SAMPLING)[0]
    broken = output_distribution(p, q, ShiftedQ.shift(q))
    tv = 0.5 * (broken - p).abs().sum().item()
    support = p > 0
    noncentrality = ROUNDS * ((broken - p)[support] ** 2 / p[support]).sum().item()
    dof = int(support.sum()) - 1
    power = stats.ncx2.sf(stats.chi2.isf(REJECT_LEVEL, dof), dof, noncentrality)
    print(f"a reported q off by TV 0.01 moves the first output token by TV {tv:.4f}; power {power:.4f}")
    assert power > 0.95, (tv, power)

    r = run_rounds(target, ShiftedQ(tiny_model("fp16", **DRAFT), VOCAB), ROUNDS, seed=1)
    worst = min(pv for _, _, pv in exactness_pvalues(target, r))
    print(f"the q off by TV 0.01: exactness chi-square p = {worst:.3g}")
    assert worst < REJECT_LEVEL, f"a q off by TV 0.01 passed the exactness test: p = {worst:.2e}"
    worst = min(pv for _, pv in draws_follow_q_pvalues(r))
    assert worst < REJECT_LEVEL, f"a q off by TV 0.01 passed the draws-follow-q test: p = {worst:.2e}"


@pytest.mark.slow
def test_reporting_the_unwarped_q_fails_exactness_and_the_contract(tiny_model, target):
    spec = PROB_DRAFTERS["draft-model"]
    r = run_rounds(target, ReportsUnwarpedQ(tiny_model("fp16", **DRAFT), VOCAB), ROUNDS // 5, seed=2)
    worst = min(pv for _, _, pv in exactness_pvalues(target, r))
    assert worst < REJECT_LEVEL, f"reporting the unwarped q passed the exactness test: p = {worst:.2e}"
    assert min(pv for _, pv in draws_follow_q_pvalues(r)) < REJECT_LEVEL
    broken = ReportsUnwarpedQ(tiny_model("fp16", **DRAFT), VOCAB)
    assert q_support_mismatch(tiny_model, spec, broken, SamplingConfig(1.0, top_k=3, seed=5)) is not None


def test_a_drafter_that_never_warps_breaks_the_support_contract(tiny_model, target):
    """Exact (it reports what it samples), so only the support check can see it: it drafts tokens that the
    warped target never accepts."""
    spec = PROB_DRAFTERS["draft-model"]
    broken = NeverWarps(tiny_model("fp16", **DRAFT), VOCAB)
    problem = q_support_mismatch(tiny_model, spec, broken, SamplingConfig(1.0, top_k=3, seed=5))
    assert problem is not None and "q > 0 at" in problem, problem
    r = run_rounds(target, NeverWarps(tiny_model("fp16", **DRAFT), VOCAB), CHUNK, seed=3)
    assert min(pv for _, _, pv in exactness_pvalues(target, r)) > PASS_LEVEL  # still exact
    assert (r.drafts[:, 0] == PAD).sum() == 0


# ---- every drafter declares its capabilities ------------------------------------------------------------------

def every_drafter(tiny_model) -> dict:
    """One of each drafter in specdec.drafters, in each mode that changes a capability."""
    draft = lambda: DraftModelDrafter(tiny_model("fp16", **DRAFT), VOCAB)  # noqa: E731
    eagle = lambda: EagleDrafter(_eagle_head(tiny_model), tiny_model("fp16", **TARGET).embed)  # noqa: E731
    return {"none": NoDrafter(), "ngram": NgramDrafter(), "ngram-unrated": NgramDrafter(rated=False),
            "suffix": SuffixDrafter(), "suffix-private": SuffixDrafter(max_tokens=0), "draft-model": draft(),
            "eagle": eagle(), "ngram,draft-model": CascadeDrafter([NgramDrafter(), draft()]),
            "suffix,eagle": CascadeDrafter([SuffixDrafter(max_tokens=0), eagle()])}


def test_every_drafter_class_is_in_the_list(tiny_model):
    made = {type(d) for d in every_drafter(tiny_model).values()}
    for info in pkgutil.iter_modules(specdec.drafters.__path__):
        module = importlib.import_module(f"specdec.drafters.{info.name}")
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and hasattr(cls, "propose") \
                    and cls is not Drafter:
                assert Drafter in cls.__mro__ and cls in made, cls


def test_every_drafter_declares_its_capabilities(tiny_model):
    """Each capability set by the drafter itself (its class or the instance), not left to the protocol's default,
    and of the declared type."""
    kinds = {"name": str, "free": bool, "confident": bool, "taps": tuple, "learns": bool, "catch_up_s": float}
    assert set(kinds) == set(CAPABILITIES)
    for label, d in every_drafter(tiny_model).items():
        mro = type(d).__mro__
        own = mro[:mro.index(Drafter)]  # the drafter's classes, the protocol's defaults left out
        for cap, kind in kinds.items():
            assert cap in vars(d) or any(cap in vars(c) for c in own), f"{label} does not declare {cap}"
            assert isinstance(getattr(d, cap), kind), (label, cap, getattr(d, cap))
        assert all(isinstance(t, int) for t in d.taps)


def test_capabilities_say_what_the_drafters_do(tiny_model):
    d = every_drafter(tiny_model)
    assert [n for n, x in d.items() if x.free] == ["none", "ngram", "ngram-unrated", "suffix", "suffix-private"]
    assert [n for n, x in d.items() if x.confident] == ["ngram", "eagle", "ngram,draft-model", "suffix,eagle"]
    assert [n for n, x in d.items() if x.taps] == ["eagle", "suffix,eagle"]
    assert d["suffix,eagle"].taps == d["eagle"].taps
    assert [n for n, x in d.items() if x.learns] == ["ngram", "suffix", "ngram,draft-model"]
