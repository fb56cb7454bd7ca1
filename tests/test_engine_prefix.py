"""Prefix caching: a prompt that starts with tokens a finished sequence held reuses their keys and values, and its
output is identical to a run without the cache (greedy and sampled, plain and speculative); the store evicts
the least recently used entry; a model that cannot reuse exactly refuses."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.prefix import PrefixCache
from specdec.errors import SpecdecError
from specdec.sampling.warp import SamplingConfig

VOCAB = 64


def document(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (n,), generator=g).tolist()


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0, seed=7)])
@pytest.mark.parametrize("speculate", [False, True])
def test_second_question_reuses_the_document_and_answers_identically(tiny_model, sampling, speculate):
    model = tiny_model("fp16", vocab=VOCAB, max_pos=512)
    doc = document(150, 0)
    first, second = doc + [5, 6, 7], doc + [9, 8]
    cfg = GenerationConfig(24, sampling)
    drafter, k = (NgramDrafter(3, 1), 4) if speculate else (None, 1)
    fresh = [Engine(model, None).generate([p], cfg, drafter, k)[0] for p in (first, second)]
    cached = Engine(model, None, prefix_cache=2)
    got = [cached.generate([p], cfg, drafter, k)[0] for p in (first, second)]
    assert [r.token_ids for r in got] == [r.token_ids for r in fresh]
    assert got[0].stats.cached_tokens == 0
    assert got[1].stats.cached_tokens == len(doc)  # the document; the question is new
    # the next turn of the conversation: the first exchange, answer included, is reused
    turn = first + got[0].token_ids + [3, 3]
    again = cached.generate([turn], cfg, drafter, k)[0]
    assert again.token_ids == Engine(model, None).generate([turn], cfg, drafter, k)[0].token_ids
    assert again.stats.cached_tokens >= len(first) + len(got[0].token_ids) - 1


def test_a_repeated_prompt_prefills_only_its_last_token(tiny_model):
    model = tiny_model("fp16", vocab=VOCAB, max_pos=512)
    prompt = document(100, 1)
    engine = Engine(model, None, prefix_cache=1)
    a, b = (engine.generate([prompt], GenerationConfig(8))[0] for _ in range(2))
    assert a.token_ids == b.token_ids
    assert b.stats.cached_tokens == len(prompt) - 1  # the last prompt token's logits are still computed


def test_least_recently_used_entry_is_evicted(tiny_model):
    model = tiny_model("fp16", vocab=VOCAB, max_pos=512)
    engine = Engine(model, None, prefix_cache=2)
    docs = [document(70, s) for s in (10, 11, 12)]
    cfg = GenerationConfig(4)

    def cached(doc):
        return engine.generate([doc + [1]], cfg)[0].stats.cached_tokens

    assert [cached(d) for d in docs[:2]] == [0, 0]
    assert cached(docs[0]) == 70  # docs[0] used again: docs[1] is now the least recent
    assert cached(docs[2]) == 0  # stored in place of docs[1]
    assert cached(docs[0]) == 70
    assert cached(docs[1]) == 0
    assert engine.prefix.hits == 2 and engine.prefix.reused_tokens == 140


def test_store_keeps_a_longer_entry_and_replaces_one_it_extends(tiny_model):
    model = tiny_model("fp16", vocab=VOCAB, max_pos=512)
    store = PrefixCache(model, 2, 256)
    cache = model.new_cache(1, 256)
    doc = document(80, 3)
    store.store(doc[:40], cache, 0)
    store.store(doc, cache, 0)  # extends the first: replaces it, no second entry
    assert [e is None for e in store.entries].count(True) == 1
    store.store(doc[:60], cache, 0)  # already held
    assert [len(e.tokens) for e in store.entries if e is not None] == [80]


def test_a_model_without_exact_reuse_refuses(tiny_model):
    model = tiny_model("fp32", vocab=VOCAB)
    with pytest.raises(SpecdecError, match="native kernels"):
        Engine(model, None, prefix_cache=1)
