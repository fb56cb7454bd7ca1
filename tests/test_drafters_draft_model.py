"""The draft-model drafter: vocabulary check, the shape of what it proposes, vocabularies of other sizes, and
the target drafting for itself (every draft accepted, at temperature 0 and 1)."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.models.text.tokenizer import Tokenizer
from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig
from tests.conftest import greedy_reference_rows, write_word_tokenizer

VOCAB = 32
WORDS = ["<unk>", "<eos>", *[f"w{i}" for i in range(VOCAB - 2)]]


def test_check_compatible(tmp_path):
    folders = {}
    for name, words in (("a", WORDS), ("b", WORDS), ("swapped", [WORDS[0], WORDS[1], WORDS[3], WORDS[2], *WORDS[4:]]),
                        ("renamed", [*WORDS[:-1], "other"]), ("short", WORDS[:-1])):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        write_word_tokenizer(folders[name], words)
    tok = {name: Tokenizer.from_dir(path) for name, path in folders.items()}
    DraftModelDrafter.check_compatible(tok["a"], tok["b"])
    for other in ("swapped", "renamed", "short"):
        with pytest.raises(SpecdecError, match="tokenizer differs"):
            DraftModelDrafter.check_compatible(tok["a"], tok[other])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_proposal_shape_and_rows_with_k_0(tiny_model, temperature):
    draft = DraftModelDrafter(tiny_model("fp16", vocab=VOCAB, seed=1), VOCAB)
    assert not draft.free
    ctxs = [[1, 2, 3, 4, 5], [6, 7], [8] * 20]  # the last one is fed through the prefill path
    draft.reserve(3, 64)
    for slot, c in enumerate(ctxs):
        draft.open(slot, c, SamplingConfig(temperature, seed=slot))
    ks = [4, 0, 3]  # the middle row drafts nothing, the last fewer than the widest
    out = draft.propose([0, 1, 2], ctxs, ks)
    assert out.tokens.shape == (3, 4) and out.tokens.dtype == torch.long
    assert (out.tokens[1] == PAD).all() and (out.tokens[2, 3] == PAD).all()
    assert (out.tokens[0] >= 0).all() and (out.tokens[2, :3] >= 0).all()
    if temperature == 0:
        assert out.probs is None  # greedy: q is one-hot on the drafted tokens
    else:
        assert out.probs.shape == (3, 4, VOCAB)
        for r, k in enumerate(ks):  # a distribution at every drafted position, giving its token mass
            assert torch.allclose(out.probs[r, :k].sum(-1), torch.ones(k))
            assert (out.probs[r, :k].gather(1, out.tokens[r, :k].unsqueeze(1)) > 0).all()
    draft.accepted([0, 2], [2, 3])  # only the slots that drafted hear back, as the engine does it
    # at most k-1 drafts were fed to the draft model: 2 of row 0's 3, and row 2's 2 (of 3 accepted)
    assert draft.valid == {0: 5 + 2, 1: 0, 2: 20 + 2}


@pytest.mark.parametrize("draft_vocab", [VOCAB - 4, VOCAB + 8])
def test_draft_vocabulary_of_another_size(tiny_model, draft_vocab):
    """A draft model with a padded (larger) or smaller embedding: q is cut and renormalised, or zero-filled,
    to the target's vocabulary, and speculative output stays the target's."""
    target = tiny_model("fp16", vocab=VOCAB)
    draft = DraftModelDrafter(tiny_model("fp16", vocab=draft_vocab, seed=1), VOCAB)
    ctxs = [[1, 2, 3]]
    draft.reserve(1, 32)
    draft.open(0, ctxs[0], SamplingConfig(1.0, seed=0))
    q = draft.propose([0], ctxs, [3]).probs
    assert q.shape == (1, 3, VOCAB) and torch.allclose(q.sum(-1), torch.ones(1, 3))
    if draft_vocab < VOCAB:
        assert (q[..., draft_vocab:] == 0).all()
    prompts = [[1, 2, 3], [4, 5]]
    plain = greedy_reference_rows(target, prompts, 20)
    results = Engine(target, None).generate(prompts, GenerationConfig(20), draft, 3)
    assert [r.token_ids for r in results] == plain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_target_drafting_for_itself_is_always_accepted(tiny_model, temperature):
    """q comes from the draft's one-token passes, p from the target's verify pass over the same tokens: on the
    fp16 path they agree bit for bit, so u * q < p always holds (only the prompt's keys and values differ, by
    rounding, between the target's prefill and the draft's decode-path feed: a rejection chance near 1e-7 per
    token). Any real batch dependence would show as rejections."""
    model = tiny_model("fp16", vocab=VOCAB, std=0.3)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12, 13]] * 20
    results = Engine(model, None).generate(prompts, GenerationConfig(12, SamplingConfig(temperature, seed=3)),
                                           DraftModelDrafter(model, VOCAB), 4)
    drafted = sum(r.stats.drafted for r in results)
    accepted = sum(r.stats.accepted for r in results)
    assert drafted > 0 and accepted == drafted
    # a = 1 exactly: every round drafts k = 4 and yields 5; after 1 + 5 + 5 tokens the budget of 12 leaves room
    # for one, so the third round drafts nothing (the engine never drafts past the budget) and yields the target's
    for res in results:
        assert [(len(r.drafted), r.accepted, r.emitted, r.kind) for r in res.stats.rounds] == [
            (4, 4, 5, "bonus"), (4, 4, 5, "bonus"), (0, 0, 1, "bonus")], res.stats.rounds
    if temperature > 0:
        assert len({tuple(r.token_ids) for r in results}) > 3  # it did sample


def test_each_slot_drafts_as_it_would_alone(tiny_model):
    """Per-slot sampling settings and random streams: a slot's drafts and q, over two rounds with feedback, are
    bit for bit what it gets alone in a drafter of one slot, whatever its company (greedy, other temperatures,
    a prompt fed through the prefill path)."""
    model = tiny_model("fp16", vocab=VOCAB, seed=1)
    ctxs = [[1, 2, 3, 4, 5], [6, 7], [8] * 20]
    settings = [SamplingConfig(1.0, seed=11), SamplingConfig(0.0), SamplingConfig(0.8, top_k=5, seed=12)]
    accepted = [1, 4, 0]  # after the first round: then the context grows by the accepted drafts and one token

    def two_rounds(slots, rows):
        d = DraftModelDrafter(model, VOCAB)
        d.reserve(max(slots) + 1, 64)
        for s, r in zip(slots, rows):
            d.open(s, ctxs[r], settings[r])
        first = d.propose(slots, [ctxs[r] for r in rows], [4] * len(rows))
        d.accepted(slots, [accepted[r] for r in rows])
        grown = [ctxs[r] + first.tokens[i, :accepted[r]].tolist() + [9] for i, r in enumerate(rows)]
        second = d.propose(slots, grown, [3] * len(rows))
        return first, second

    together = two_rounds([4, 0, 2], [0, 1, 2])
    for i, r in enumerate(range(3)):
        alone = two_rounds([0], [r])
        for got, want in zip(together, alone):
            assert torch.equal(got.tokens[i], want.tokens[0]), (r, got.tokens[i], want.tokens[0])
            if not settings[r].greedy:
                assert torch.equal(got.probs[i], want.probs[0]), r


def test_a_draft_model_with_a_shorter_context_bounds_the_scheduler(tiny_model):
    """Target 256 positions, draft model 64: the step loop serves 64, refuses longer prompts with a clear error,
    and a sequence stops at the draft model's limit instead of writing past its cache."""
    from specdec.engine.policy import FixedK
    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.engine.sequence import Sequence

    target = tiny_model("fp16", vocab=VOCAB, max_pos=256)
    sched = Scheduler(target, None, DraftModelDrafter(tiny_model("fp16", vocab=VOCAB, max_pos=64), VOCAB),
                      FixedK(3), SchedulerConfig(max_batch=2))
    assert sched.context == 64
    with pytest.raises(SpecdecError, match="the context is 64"):
        sched.admit(Sequence(list(range(1, 31)) * 3, GenerationConfig(4)))
    seq = Sequence(list(range(1, 31)), GenerationConfig(100))
    sched.admit(seq)
    while not sched.idle:
        sched.step()
    # every position of the slot was used; the last token, sampled from position 63, is never fed back
    assert seq.finish == "length" and seq.length == 64 and seq.prompt_len + seq.num_generated == 65
