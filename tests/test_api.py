"""The one-import entry point (specdec/api.py): what the README's Python example runs."""

from __future__ import annotations

import pytest

import specdec
from specdec.errors import SpecdecError

PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def gen():
    return specdec.load("default", drafter="ngram")


def test_speculative_text_is_plain_decodings(gen):
    """Greedy output through the entry point is the target's own: the same tokens as with no drafter, and the
    drafter did accept tokens (so the comparison is not of two plain runs)."""
    fast = gen(PROMPT, max_new_tokens=24, k=4)
    plain = specdec.load("default", drafter="none")(PROMPT, max_new_tokens=24, k=0)
    assert fast.token_ids == plain.token_ids and fast.text == plain.text
    assert fast.stats.summary()["alpha"] > 0


def test_a_list_of_prompts_gives_a_list_and_auto_k_plans(gen):
    out = gen([PROMPT, "Name three colours."], max_new_tokens=8)
    assert [len(r.token_ids) > 0 for r in out] == [True, True]
    assert [h.policy for h in gen._policies].count("auto") == 1  # k="auto": the planner, made once and kept


@pytest.mark.parametrize("call, fragment", [
    (lambda g: g([], max_new_tokens=4), "non-empty list"),
    (lambda g: g(PROMPT, k=-1), "k must be an integer"),
    (lambda g: g(PROMPT, temperature=-1.0), "temperature"),
    (lambda g: g(PROMPT, max_new_tokens=0), "max new tokens"),
])
def test_bad_arguments_are_one_line_errors(gen, call, fragment):
    with pytest.raises(SpecdecError, match=fragment):
        call(gen)


def test_an_unknown_drafter_is_named():
    with pytest.raises(SpecdecError, match="unknown drafter 'ngrm'"):
        specdec.generate(PROMPT, drafter="ngrm")


def test_the_readmes_python_example_runs(capsys):
    """The README's Python section, run as written."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("## Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "acceptance" in out and "tokens per round" in out


def test_drafter_none_is_plain_decoding_whatever_k_asks():
    from specdec.engine.speculation import Speculation

    plain = specdec.load("default", drafter="none")
    assert plain.drafter.name == "none"
    out = plain(PROMPT, max_new_tokens=8, k=4, policy="fixed")  # drafter none reads as never, in one place
    assert out.stats.drafted == 0 and set(plain._policies) == {Speculation("never", 0)}


def test_a_generator_called_again_reuses_its_step_loop_and_pool(gen):
    first = gen(PROMPT, max_new_tokens=12, k=3, policy="fixed")
    sched = gen._engine._sched
    again = gen(PROMPT, max_new_tokens=12, k=3, policy="fixed")
    assert gen._engine._sched is sched and again.token_ids == first.token_ids  # nothing allocated, the same text
    both = gen([PROMPT, PROMPT + " Again."], max_new_tokens=12, k=3, policy="fixed")  # more rows than the pool
    assert gen._engine._sched is not sched and gen._engine._sched.cfg.max_batch == 2
    assert both[0].token_ids == first.token_ids  # a row's tokens do not depend on the pool or its neighbours
    fresh = specdec.load("default", drafter="ngram")(PROMPT, max_new_tokens=12, k=3, policy="fixed")
    assert fresh.token_ids == first.token_ids
