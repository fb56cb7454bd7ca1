"""Rollback: after rounds whose drafts were rejected, every KV cache (the target's, and the draft model's own)
holds at its valid positions exactly what a fresh plain run over the accepted context writes there, as if the
rejected tokens had never been seen."""

from __future__ import annotations

import torch

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.generate import Engine, GenerationConfig
from tests.conftest import greedy_reference_rows, prefill_cache, teacher_forced
from tests.drafting import ScriptedDrafter

VOCAB = 64
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1, 8]]  # different lengths, each <= 16 (the draft never prefills)
N = 30
K = 4


class CacheSpy:
    """The model, keeping hold of every cache the engine (or a drafter) creates."""

    def __init__(self, model):
        self.model, self.cfg, self.caches = model, model.cfg, []

    def new_cache(self, batch, capacity, huge_pages=True):
        self.caches.append(self.model.new_cache(batch, capacity))
        return self.caches[-1]

    def forward(self, *args, **kw):
        return self.model.forward(*args, **kw)

    def forward_ragged(self, *args, **kw):
        return self.model.forward_ragged(*args, **kw)


def assert_cache_equal(cache, reference, valid: list[int], what: str) -> None:
    """Keys and values of every layer, row r at positions [0, valid[r]), must be bit-identical."""
    for r, n in enumerate(valid):
        for layer in range(len(cache.k)):
            for name, got, ref in (("keys", cache.keys, reference.keys), ("values", cache.values, reference.values)):
                a, b = got(layer)[r, :, :n], ref(layer)[r, :, :n]
                if not torch.equal(a, b):
                    pos = int((a != b).any(dim=0).any(dim=-1).nonzero()[0])
                    raise AssertionError(f"{what}: row {r}, layer {layer} {name} differ at position {pos} of {n} "
                                         f"valid (max |diff| {(a - b).abs().max().item():.3g})")


def test_target_cache_after_rejections_equals_a_fresh_plain_run(tiny_model):
    """A drafter that is right for j tokens and then proposes junk, j cycling 0..k (full rejection, partial,
    full acceptance). Before every round, the target cache's valid positions (the context but its last token)
    must equal a plain run's; the junk written past them must never leak in."""
    model = tiny_model("fp16", vocab=VOCAB)
    plain = greedy_reference_rows(model, PROMPTS, N + K + 1)
    futures = [p + o for p, o in zip(PROMPTS, plain)]
    # the plain run's cache over the whole future, with the engine's prefill (the same padded batch)
    reference, _ = teacher_forced(model, PROMPTS, plain, capacity=128)
    spy = CacheSpy(model)
    checks = []

    def check(contexts):
        valid = [len(c) - 1 for c in contexts]
        assert_cache_equal(spy.caches[0], reference, valid, f"before round {len(checks)}")
        checks.append(valid)

    drafter = ScriptedDrafter(futures, VOCAB, correct=lambda i: i % (K + 1), on_propose=check)
    results = Engine(spy, None).generate(PROMPTS, GenerationConfig(N), drafter, K)
    assert [res.token_ids for res in results] == [o[:N] for o in plain]
    rejected = [h for h in drafter.heard if min(h) < K]
    assert rejected and len(checks) == len(drafter.heard) > 5
    # and at the end: everything that was accepted, the last token aside
    assert_cache_equal(spy.caches[0], reference, [len(p) + N - 1 for p in PROMPTS], "after the last round")


def test_all_junk_drafts_leave_the_cache_as_plain_decoding_does(tiny_model):
    """Every draft rejected, every round: the cache and the output are plain decoding's."""
    model = tiny_model("fp16", vocab=VOCAB)
    plain = greedy_reference_rows(model, PROMPTS, N + K + 1)
    reference, _ = teacher_forced(model, PROMPTS, plain, capacity=128)
    spy = CacheSpy(model)
    drafter = ScriptedDrafter([p + o for p, o in zip(PROMPTS, plain)], VOCAB, correct=lambda i: 0)
    results = Engine(spy, None).generate(PROMPTS, GenerationConfig(N), drafter, K)
    assert all(a == [0, 0] for a in drafter.heard)
    assert [res.token_ids for res in results] == [o[:N] for o in plain]
    assert_cache_equal(spy.caches[0], reference, [len(p) + N - 1 for p in PROMPTS], "after the last round")


def test_draft_model_cache_after_rejections_equals_a_fresh_run(tiny_model):
    """The draft model's own cache: after each round's feedback, the positions it counts as valid hold what
    the draft model computes over the accepted context from scratch (one-token passes)."""
    target = tiny_model("fp16", vocab=VOCAB)
    draft = tiny_model("fp16", vocab=VOCAB, perturb=0.5)
    plain = greedy_reference_rows(target, PROMPTS, N + K + 1)
    futures = [p + o for p, o in zip(PROMPTS, plain)]

    # the draft model over the same accepted context, from scratch, one token per pass
    ref = draft.new_cache(len(PROMPTS), 128)
    for i in range(max(len(f) for f in futures)):
        toks = torch.tensor([[f[min(i, len(f) - 1)]] for f in futures])
        draft.forward(toks, torch.tensor([min(i, len(f) - 1) for f in futures]), ref)

    spy = CacheSpy(draft)
    drafter = DraftModelDrafter(spy, VOCAB)
    seen = []
    original = drafter.accepted

    def accepted(slots, num_accepted):
        original(slots, num_accepted)
        valid = [drafter.valid.get(r, 0) for r in range(len(PROMPTS))]  # slot r holds prompt r
        assert_cache_equal(spy.caches[0], ref, valid, f"draft cache after round {len(seen)}")
        seen.append(list(num_accepted))

    drafter.accepted = accepted
    results = Engine(target, None).generate(PROMPTS, GenerationConfig(N), drafter, K)
    assert [res.token_ids for res in results] == [o[:N] for o in plain]
    assert any(0 < a < K for s in seen for a in s) and any(a == 0 for s in seen for a in s)


def test_prefill_cache_helper_matches_the_engine(tiny_model):
    """The references above rebuild the engine's prefill; check they agree on the logits it samples from."""
    model = tiny_model("fp16", vocab=VOCAB)
    _, logits = prefill_cache(model, PROMPTS, 128)
    first = [int(t) for t in logits.argmax(-1)]
    results = Engine(model, None).generate(PROMPTS, GenerationConfig(1))
    assert [r.token_ids for r in results] == [[t] for t in first]
