"""The round's decisions on recorded scenarios (tests/round_replay.py): the step loop's drafts and acceptances round
by round, and the drafts the vLLM proposer hands vLLM step by step, as recorded from the code before the round moved
into engine/round.py. A change that alters any choice fails here and names the scenario and the round."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FakeTokenizer
from tests.round_replay import RECORD, scheduler_scenarios, tiny_targets, vllm_scenarios

RECORDED = json.loads(RECORD.read_text())


def first_difference(recorded: list, now: list) -> str:
    i = next((i for i, (a, b) in enumerate(zip(recorded, now)) if a != b), min(len(recorded), len(now)))
    return (f"round {i}: recorded {recorded[i] if i < len(recorded) else 'nothing'}, "
            f"now {now[i] if i < len(now) else 'nothing'}")


@pytest.fixture(scope="module")
def scheduler_now():
    return scheduler_scenarios(tiny_targets(), FakeTokenizer(eos=()))


@pytest.mark.parametrize("scenario", sorted(RECORDED["scheduler"]))
def test_the_step_loop_chooses_as_recorded(scheduler_now, scenario):
    recorded, now = RECORDED["scheduler"][scenario], scheduler_now[scenario]
    assert now == recorded, f"{scenario}: {first_difference(recorded, now)}"


def test_the_vllm_proposer_chooses_as_recorded():
    now = vllm_scenarios()
    for scenario, recorded in RECORDED["vllm"].items():
        assert now[scenario] == recorded, f"{scenario}: {first_difference(recorded, now[scenario])}"


def test_the_replay_has_power():
    """The recorded scenarios draft, accept and reject at every kind of drafter, so a changed choice shows."""
    rejected = 0
    for scenario, rounds in RECORDED["scheduler"].items():
        drafted, accepted = sum(sum(d) for d, _ in rounds), sum(sum(a) for _, a in rounds)
        assert drafted > 0 and (accepted > 0 or "t=0 " not in scenario), scenario
        rejected += drafted > accepted
    assert rejected >= len(RECORDED["scheduler"]) - 2  # all but the confidence-trimmed greedy ones reject some
