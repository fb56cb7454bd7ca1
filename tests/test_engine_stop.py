"""When generation ends: EOS (not emitted), stop strings (the text is cut at the stop string), the token budget
(never exceeded, even when a round yields k+1 tokens) and a full context; and the statistics a request reports."""

from __future__ import annotations

import random

import pytest

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.sequence import STOP_WINDOW, Sequence
from specdec.engine.stats import AcceptanceMeter, RequestStats, RoundRecord
from specdec.errors import SpecdecError
from tests.conftest import FakeTokenizer, greedy_reference, greedy_reference_rows
from tests.drafting import ScriptedDrafter

VOCAB = 26  # the fake tokenizer spells token i as one letter
PROMPT = [1, 2, 3, 4, 5, 6]
K = 4


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("fp16", vocab=VOCAB, std=0.1)


@pytest.fixture(scope="module")
def plain(model):
    out = greedy_reference_rows(model, [PROMPT], 60)[0]
    assert len(set(out[5:])) >= 2  # something to stop at
    return out


def oracle(plain, correct=lambda i: 10**9):
    """Drafts the plain continuation: every round accepts all k drafts and adds a bonus token."""
    return ScriptedDrafter([PROMPT + plain], VOCAB, correct)


def test_eos_ends_generation_and_is_not_emitted(model, plain):
    for at in (0, 3, 9, 14):  # the first EOS at various places, also inside a round of accepted drafts
        eos = plain[at]
        first = plain.index(eos)
        for drafter in (None, NgramDrafter(), oracle(plain)):
            res = Engine(model, FakeTokenizer({eos})).generate([PROMPT], GenerationConfig(50), drafter, K)[0]
            assert res.finish_reason == "eos"
            assert res.token_ids == plain[:first]
            assert res.text == FakeTokenizer().decode(plain[:first])
            assert len(res.origins) == len(res.token_ids) == len(res.stats.token_times)


def test_stop_string_cuts_the_text(model, plain):
    text = FakeTokenizer().decode(plain)
    for at in (2, 7, 12):
        stop = text[at:at + 2]
        cut = text.index(stop)
        for drafter in (None, NgramDrafter(), oracle(plain)):
            res = Engine(model, FakeTokenizer()).generate(
                [PROMPT], GenerationConfig(50, stop=("zzzz", stop)), drafter, K)[0]
            assert res.finish_reason == "stop"
            assert res.text == text[:cut]
            assert res.token_ids == plain[:cut + 2]  # up to the token that completes the stop string
            assert sum(r.emitted for r in res.stats.rounds) + 1 == len(res.token_ids)


def test_token_budget_is_never_exceeded(model, plain):
    """Every round yields k+1 tokens (all drafts accepted, plus the bonus): the budget cuts the last one."""
    for budget in range(1, 16):
        res = Engine(model, None).generate([PROMPT], GenerationConfig(budget), oracle(plain), K)[0]
        assert res.token_ids == plain[:budget]
        assert res.finish_reason == "length"
        rounds = res.stats.rounds
        assert all(r.accepted == len(r.drafted) for r in rounds)
        assert sum(r.emitted for r in rounds) + 1 == budget
        assert all(r.emitted == K + 1 for r in rounds[:-1])
        assert res.stats.generated_tokens == budget


def test_budget_in_a_batch_with_mixed_acceptance(model):
    prompts = [PROMPT, [9, 9, 9, 9], [3]]
    for budget in (1, 2, 7, 13):
        results = Engine(model, None).generate(prompts, GenerationConfig(budget), NgramDrafter(), K)
        assert [len(r.token_ids) for r in results] == [budget] * 3


def test_full_context_ends_generation_instead_of_overrunning_the_cache(tiny_model):
    """A model with 64 positions: the prompt plus the budget would not fit. Generation stops with "length"
    once the context is full (it used to run past the cache and raise); the tokens are still plain greedy's."""
    model = tiny_model("fp16", vocab=VOCAB, max_pos=64)
    long_prompt, short_prompt = (PROMPT * 9)[:54], [7, 8]
    fits = 64 + 1 - len(long_prompt)  # the last token is predicted at position 63 and never fed
    plain = [greedy_reference(model, long_prompt, fits), greedy_reference(model, short_prompt, 40)]
    futures = [long_prompt + plain[0], short_prompt + plain[1]]
    draft = DraftModelDrafter(tiny_model("fp16", vocab=VOCAB, max_pos=64, perturb=0.5), VOCAB)
    for drafter in (None, NgramDrafter(), ScriptedDrafter(futures, VOCAB), draft):
        results = Engine(model, None).generate([long_prompt, short_prompt], GenerationConfig(40), drafter, K)
        assert [r.finish_reason for r in results] == ["length", "length"]
        assert results[0].token_ids == plain[0]
        assert results[1].token_ids == plain[1]  # the other row is unaffected


def test_prompt_longer_than_the_context_is_refused(tiny_model):
    model = tiny_model("fp16", vocab=VOCAB, max_pos=64)
    with pytest.raises(SpecdecError, match="does not fit"):
        Engine(model, None).generate([[1] * 64], GenerationConfig(4))
    with pytest.raises(SpecdecError, match="at least one token"):
        Engine(model, None).generate([[1], []], GenerationConfig(4))


# ---- statistics ------------------------------------------------------------------------------------------------

def hand_built() -> RequestStats:
    """Three rounds: 4 drafted / 2 accepted (recovered), 4 / 4 (bonus), 2 / 0 (recovered), and a round that
    drafted nothing; the first token came from the prefill at t = 0.1."""
    rounds = [
        RoundRecord(drafted=[5, 6, 7, 8], accepted=2, token=9, kind="recovered", emitted=3, draft_s=0.01,
                    verify_s=0.02, t=0.2),
        RoundRecord(drafted=[1, 2, 3, 4], accepted=4, token=5, kind="bonus", emitted=5, draft_s=0.01,
                    verify_s=0.03, t=0.3),
        RoundRecord(drafted=[7, 7], accepted=0, token=1, kind="recovered", emitted=1, draft_s=0.005,
                    verify_s=0.02, t=0.45),
        RoundRecord(drafted=[], accepted=0, token=2, kind="bonus", emitted=1, draft_s=0.0, verify_s=0.01, t=0.5),
    ]
    times = [0.1] + [0.2] * 3 + [0.3] * 5 + [0.45] + [0.5]
    return RequestStats(prompt_tokens=7, generated_tokens=11, ttft_s=0.1, total_s=0.5, rounds=rounds,
                        token_times=times)


def test_request_stats():
    st = hand_built()
    assert (st.drafted, st.accepted) == (10, 6)
    assert st.alpha == pytest.approx(0.6)
    assert st.mean_tokens_per_round == pytest.approx(10 / 4)
    assert st.survival_by_position() == pytest.approx([2 / 3, 2 / 3, 1 / 2, 1 / 2])
    assert st.inter_token_latencies() == pytest.approx([0.1, 0, 0, 0.1, 0, 0, 0, 0, 0.15, 0.05])
    assert st.tokens_per_s == pytest.approx(22.0)
    assert st.decode_tokens_per_s == pytest.approx(10 / 0.4)  # 10 tokens after the first, in 0.4 s
    assert (st.draft_s, st.verify_s) == (pytest.approx(0.025), pytest.approx(0.08))
    summary = st.summary()
    assert summary["alpha"] == pytest.approx(0.6) and summary["rounds"] == 4 and summary["generated_tokens"] == 11
    assert set(summary) >= {"alpha", "mean_tokens_per_round", "survival_by_position", "tokens_per_s", "ttft_s"}


def test_empty_stats():
    st = RequestStats()
    assert st.alpha is None and st.mean_tokens_per_round == 0.0 and st.survival_by_position() == []
    assert st.inter_token_latencies() == [] and st.tokens_per_s == 0.0


def test_acceptance_meter():
    meter = AcceptanceMeter(halflife_tokens=4)
    meter.update(0, 0)  # nothing drafted: no information
    assert meter.alpha is None and meter.ema is None
    meter.update(4, 4)
    assert meter.ema == 1.0
    meter.update(4, 0)  # one half-life of new evidence at rate 0: the old 4 weigh 2, so 2 of 6
    assert meter.ema == pytest.approx(2 / 6) and meter.alpha == pytest.approx(0.5)


@pytest.mark.parametrize("budget", [7, 13, 30])
@pytest.mark.parametrize("name", ["ngram", "oracle"])
def test_engine_stats_are_consistent(model, plain, name, budget):
    drafter = NgramDrafter() if name == "ngram" else oracle(plain)
    res = Engine(model, None).generate([PROMPT], GenerationConfig(budget), drafter, K)[0]
    st = res.stats
    # a round's output is its accepted drafts, then its own token; the budget can cut it anywhere
    assert res.origins[0] == "prefill"
    assert res.origins.count("accepted") == sum(min(r.accepted, r.emitted) for r in st.rounds)
    assert res.origins.count("bonus") + res.origins.count("recovered") == sum(r.emitted > r.accepted
                                                                              for r in st.rounds)
    assert sum(r.emitted for r in st.rounds) + 1 == len(res.token_ids) == st.generated_tokens == budget
    assert len(st.token_times) == budget and st.token_times == sorted(st.token_times)
    assert st.ttft_s == st.token_times[0] and st.total_s >= st.token_times[-1]
    for r in st.rounds:
        assert r.kind == ("bonus" if r.accepted == len(r.drafted) else "recovered")


def test_a_stop_string_that_cuts_accepted_drafts_still_counts_them_as_accepted(model, plain):
    """Every draft right; the stop string completes at output token 2 or 3, inside the first round of 4 accepted
    drafts. Acceptance counts what the target accepted (4 of 4); the output keeps only the tokens up to the stop."""
    text = FakeTokenizer().decode(plain)
    # a stop string first seen inside the round, ending at output token `at`
    at, stop = next((a, text[a - n + 1:a + 1]) for a in (1, 2) for n in (1, 2, 3)
                    if n <= a + 1 and text.index(text[a - n + 1:a + 1]) == a - n + 1)
    res = Engine(model, FakeTokenizer()).generate([PROMPT], GenerationConfig(50, stop=(stop,)), oracle(plain), K)[0]
    assert res.finish_reason == "stop" and res.token_ids == plain[:at + 1]
    assert [(len(r.drafted), r.accepted, r.emitted) for r in res.stats.rounds] == [(K, K, at)]
    assert res.stats.accepted == K and res.stats.alpha == 1.0


@pytest.mark.parametrize("budget, last", [(7, (0, 0, 1)), (8, (1, 1, 2)), (9, (2, 2, 3))])
def test_no_draft_past_the_token_budget(model, plain, budget, last):
    """k = 4, every draft right: the prefill's token, a round of 4 + bonus, then a round that drafts only what
    the budget can still use (a round adds up to drafts + 1 tokens): nothing drafted is thrown away."""
    res = Engine(model, None).generate([PROMPT], GenerationConfig(budget), oracle(plain), K)[0]
    assert [(len(r.drafted), r.accepted, r.emitted) for r in res.stats.rounds] == [(4, 4, 5), last]
    assert res.token_ids == plain[:budget] and res.stats.alpha == 1.0
    assert res.origins == ["prefill"] + ["accepted"] * 4 + ["bonus"] + ["accepted"] * last[1] + ["bonus"]


# ---- stop strings, checked incrementally -------------------------------------------------------------------------

class CountingTokenizer:
    """Wraps a tokenizer and counts the token ids it decodes."""

    def __init__(self, inner):
        self.inner, self.decoded = inner, 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        self.decoded += len(ids)
        return self.inner.decode(ids)


class ByteTokenizer:
    """Token i is byte i; text is the bytes read as UTF-8 (a character split between tokens is U+FFFD until its
    last byte arrives)."""

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def reference_cut(output: list[int], offered: list[int], stop: tuple[str, ...], tokenizer) -> int | None:
    """The obviously right rule: the first i whose whole text output + offered[:i] holds a stop string."""
    for i in range(1, len(offered) + 1):
        if any(s in tokenizer.decode(output + offered[:i]) for s in stop):
            return i
    return None


def stream(tokens: list[int], stop: tuple[str, ...], tokenizer, seed: int) -> tuple[list[int], str | None]:
    """Emit `tokens` in rounds of 1..6, checking every round against reference_cut. Returns (output, finish)."""
    rng = random.Random(seed)
    s = Sequence([0], GenerationConfig(len(tokens) + 1, stop=stop))
    at = 0
    while at < len(tokens) and s.finish is None:
        offered = tokens[at:at + rng.randint(1, 6)]
        want = reference_cut(s.output, offered, stop, tokenizer)
        kept = s.emit(offered, ["accepted"] * len(offered), set(), tokenizer)
        assert kept == offered[:want or len(offered)], (at, offered, want, kept)
        assert s.finish == ("stop" if want else None)
        at += len(offered)
    return s.output, s.finish


def test_stop_check_decodes_a_bounded_window_per_round():
    """The tokens decoded per round do not grow with the output: 2,000 tokens in rounds of 5, no stop string
    ever found; the last rounds decode no more than the first full ones."""
    tok = CountingTokenizer(FakeTokenizer())
    s = Sequence([0], GenerationConfig(2500, stop=("zzz", "yx")))
    per_round = []
    for r in range(400):
        before = tok.decoded
        s.emit([r % 20, (r + 1) % 20, (r + 2) % 20, 3, 4], ["accepted"] * 5, set(), tok)
        per_round.append(tok.decoded - before)
    assert s.finish is None and s.num_generated == 2000
    window = 3 + STOP_WINDOW  # output tokens decoded before the round's: the longest stop string's length + 8
    bound = window + sum(window + i for i in range(1, 6))  # the window, then each of the round's 5 prefixes after it
    assert max(per_round) <= bound and per_round[-1] == per_round[20], (per_round[:3], per_round[-3:])


def test_stop_strings_spanning_rounds_are_found():
    tok = FakeTokenizer()  # token i is one letter
    s = Sequence([0], GenerationConfig(50, stop=("cdef",)))
    assert s.emit([1, 2], ["accepted"] * 2, set(), tok) == [1, 2] and s.finish is None  # "bc"
    assert s.emit([3, 4], ["accepted"] * 2, set(), tok) == [3, 4] and s.finish is None  # "bcde"
    assert s.emit([5, 6, 7], ["accepted"] * 3, set(), tok) == [5] and s.finish == "stop"  # "bcdef": cut at f
    assert s.text(tok) == "b"
    far = Sequence([0], GenerationConfig(500, stop=("xyz",)))  # past the window: the output is long
    far.emit([i % 20 for i in range(100)], ["accepted"] * 100, set(), tok)
    far.emit([23, 24], ["accepted"] * 2, set(), tok)
    assert far.finish is None
    assert far.emit([25, 1], ["accepted"] * 2, set(), tok) == [25] and far.finish == "stop"


def test_a_stop_string_whose_character_spans_rounds_is_found():
    """é is two bytes: the first round ends inside it (its text ends in U+FFFD), the next completes it."""
    tok = ByteTokenizer()
    s = Sequence([0], GenerationConfig(500, stop=("é!",)))
    s.emit(list(b"x" * 40), ["accepted"] * 40, set(), tok)
    e = list("é!".encode())
    assert s.emit(e[:1], ["accepted"], set(), tok) == e[:1] and s.finish is None
    assert s.emit(e[1:] + [65], ["accepted"] * 2, set(), tok) == e[1:] and s.finish == "stop"


@pytest.mark.parametrize("seed", range(12))
def test_incremental_stop_check_equals_decoding_the_whole_output(seed):
    """Random UTF-8 text (one to four bytes a character) as byte tokens in random rounds, with stop strings taken
    from the text (some spanning characters' bytes and rounds) or absent: every round keeps what the whole-text
    rule keeps."""
    rng = random.Random(seed)
    alphabet = ["a", "b", " ", "é", "€", "😀", "ß", "\n"]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(40, 200)))
    tokens = list(text.encode())
    at = rng.randrange(len(text) // 2, len(text))
    stop = (text[at:at + rng.randint(1, 5)], "never" if seed % 2 else "€€€€€€€€€€€€€€€€€")
    stream(tokens, stop, ByteTokenizer(), seed)
    stream(tokens, ("qq", "\ufffd"), ByteTokenizer(), seed)  # U+FFFD itself: found where a character is split


@pytest.mark.parametrize("seed", range(4))
def test_incremental_stop_check_equals_it_on_the_bundled_tokenizer(bundled_path, seed):
    """Byte-level BPE (merges, a leading-space marker, multi-byte characters over several tokens)."""
    from specdec.models.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(bundled_path)
    rng = random.Random(seed)
    words = ["the", " cat", " sat", "é", "über", " 😀", " naïve", "\n", "  ", "12", "€5", " 日本語", "."]
    text = "".join(rng.choice(words) for _ in range(150))
    at = rng.randrange(len(text) // 2, len(text) - 5)
    for stop in ((text[at:at + rng.randint(1, 6)],), ("zzzq",)):
        stream(tok.encode(text), stop, tok, seed)
