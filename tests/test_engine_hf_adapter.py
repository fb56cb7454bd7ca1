"""The transformers fallback (HFAdapter) behind the engine: batch 1, rollback by cropping its cache."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from tests.conftest import first_divergence
from tests.drafting import ScriptedDrafter

VOCAB = 48
PROMPT = [5, 6, 7, 8, 5, 6]
N = 30


@pytest.fixture(scope="module")
def adapters(tiny_dir):
    from specdec.models.hf_adapter import HFAdapter

    return HFAdapter(tiny_dir(vocab=VOCAB, std=0.1)), HFAdapter(tiny_dir(vocab=VOCAB, std=0.1, perturb=0.5))


def plain_hf(adapter, prompt, n):
    """Greedy decoding with transformers' model alone: the whole sequence each step, no cache, argmax."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(adapter.hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_hf_adapter_greedy_equals_transformers_generate(adapters):
    target, relative = adapters
    expected = plain_hf(target, PROMPT, N)
    futures = [PROMPT + expected + [0] * 8]
    engine = Engine(target, None)
    for drafter in (None, NgramDrafter(), DraftModelDrafter(relative, VOCAB),
                    ScriptedDrafter(futures, VOCAB, correct=lambda i: i % 4)):
        res = engine.generate([PROMPT], GenerationConfig(N), drafter, 3)[0]
        found = first_divergence(target, PROMPT, expected, res.token_ids)
        # fp32 through transformers is not batch-invariant: a difference may only sit at a near-tie
        assert found is None or found[1] < 1e-4, f"{getattr(drafter, 'name', 'none')}: first difference at " \
                                                 f"{found[0]}, top-2 logit gap {found[1]:.3g}"
        if isinstance(drafter, ScriptedDrafter):  # rejected drafts in most rounds: the cache was cropped each time
            assert [r.accepted for r in res.stats.rounds] == [min(i % 4, len(r.drafted))
                                                              for i, r in enumerate(res.stats.rounds)]


def test_hf_adapter_refuses_batches(adapters):
    with pytest.raises(SpecdecError, match="one sequence at a time"):
        Engine(adapters[0], None).generate([PROMPT, PROMPT], GenerationConfig(4))
