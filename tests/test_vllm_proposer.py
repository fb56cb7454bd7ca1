"""specdec's vLLM proposer (specdec/integrations/vllm.py) against a simulated vLLM batch, without vLLM: rows join
(after a prefill step), finish, and move as vLLM's persistent batch condenses; greedy verification; a fed clock
that prices each step by its token-rows. The real vLLM runs it in tests/test_vllm.py (slow).

What must hold: every request's context as the drafter sees it is the request's true sequence, however rows move;
acceptance is counted from the tokens a row gained; the auto policy drafts where a wider step is nearly free and
stops where it costs in proportion to its rows; configuration errors are one clear line."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from specdec.engine.policy import LearnedPassCost
from specdec.engine.speculation import DEFAULT_K, Speculation
from specdec.errors import SpecdecError
from specdec.integrations.vllm import ENV, Proposer, ProposerConfig

MAX_LEN = 2048


def vllm_config(k: int = 6, max_seqs: int = 16) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=MAX_LEN),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_seqs))


def target(seq: list[int]) -> int:
    """A deterministic 'model': mostly repeats the token 7 back (prompt lookup finds it), now and then not."""
    n = len(seq)
    return (seq[-7] + (1 if n % 11 == 0 else 0)) % 50 if n >= 7 else (3 * n + 1) % 50


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Batch:
    """vLLM's persistent batch, as far as a proposer sees it: a new request takes the lowest free row, spends one
    step prefilling (no sampled tokens), and a finished request leaves a hole that the last row moves into."""

    def __init__(self, proposer: Proposer, clock: Clock, cost, seed: int = 0):
        self.p, self.clock, self.cost = proposer, clock, cost
        self.rng = np.random.default_rng(seed)
        self.rows: list[dict | None] = []
        self.drafts: list[list[int]] = []
        self.finished: list[dict] = []

    def add(self, prompt: list[int], budget: int, rid: int, twist: int | None = None) -> None:
        """twist: the position where this request's target token differs from the shared target's (sampling)."""
        req = {"rid": rid, "seq": list(prompt), "budget": budget, "gained": [], "draft": [], "twist": twist,
               "prefilling": 1 + len(prompt) // 20}  # steps of chunked prefill: no sampled tokens until the last
        if None in self.rows:
            self.rows[self.rows.index(None)] = req
        else:
            self.rows.append(req)

    def condense(self) -> None:
        while None in self.rows:
            hole = self.rows.index(None)
            last = self.rows.pop()
            if hole < len(self.rows):
                self.rows[hole] = last

    def step(self) -> None:
        """Run the step (verify each row's draft greedily), then ask the proposer for the next drafts."""
        width = 0
        for req in self.rows:
            next_token = lambda req=req: (target(req["seq"]) + (len(req["seq"]) == req["twist"])) % 50

            if req["prefilling"]:
                req["prefilling"] -= 1
                req["gained"] = []
                if not req["prefilling"]:
                    req["seq"].append(next_token())
                    req["gained"] = req["seq"][-1:]
                width += 20
                continue
            gained = []
            for d in req["draft"]:
                if d != next_token():
                    break
                req["seq"].append(d)
                gained.append(d)
            req["seq"].append(next_token())
            req["gained"] = gained + req["seq"][-1:]
            width += len(req["draft"]) + 1
        self.clock.t += self.cost(width)
        n = len(self.rows)
        ids = np.zeros((n, MAX_LEN), dtype=np.int32)
        for i, req in enumerate(self.rows):
            ids[i, :len(req["seq"])] = req["seq"]
        drafts = self.p.propose([r["gained"] for r in self.rows], np.array([len(r["seq"]) for r in self.rows]), ids)
        assert len(drafts) == n
        for req, d in zip(self.rows, drafts):
            assert len(d) <= self.p.k
            req["draft"] = d
        self.clock.t += 0.0001  # what proposing took
        # rid -> (the context the proposer holds for the request in row i, the request's true sequence)
        self.seen = {req["rid"]: (list(self.p.rows.at[i].tokens), list(req["seq"]))
                     for i, req in enumerate(self.rows) if i in self.p.rows.at}
        for i, req in enumerate(self.rows):  # vLLM drops finished requests before the next step
            if len(req["seq"]) >= req["budget"]:
                self.finished.append(req)
                self.rows[i] = None
        self.condense()

def make(policy="auto", k=6, cost=lambda w: 0.01, drafter="ngram", row_floor=0.97):
    clock = Clock()
    fixed_k = k if policy in ("always", "fixed") else "auto"  # auto: the default cap, at most vLLM's k
    p = Proposer(vllm_config(k), ProposerConfig(drafter=drafter, policy=policy, k=fixed_k, report_s=0,
                                                row_floor=row_floor), clock=clock)
    return p, Batch(p, clock, cost)


def prompt(i: int, n: int) -> list[int]:
    return [(i * 13 + j * 7) % 50 for j in range(n)]


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "ngram,suffix"])
def test_requests_joining_and_leaving_keep_their_own_context(drafter):
    p, b = make(drafter=drafter)
    rid = done = 0
    for step in range(120):
        if step % 5 == 0 and rid < 14:  # requests of different lengths join mid-stream
            b.add(prompt(rid, 5 + 9 * (rid % 4)), budget=40 + 13 * (rid % 5) + len(prompt(rid, 5 + 9 * (rid % 4))),
                  rid=rid)
            rid += 1
        b.step()
        assert set(b.seen) == {req["rid"] for req in b.rows if req["gained"]} | \
            {req["rid"] for req in b.finished[done:]}  # every decoding row is matched, and only those
        done = len(b.finished)
        for r, (held, true) in b.seen.items():
            assert held == true, f"request {r} at step {step}"
    assert len(b.finished) >= 10
    assert p.rows.opened == rid and len(p.rows.live) == len(b.rows)  # every request opened once, finished closed
    s = p.summary()
    assert s["drafted"] > 0 and 0.3 < s["acceptance"] <= 1.0


def test_rows_that_swap_places_keep_their_state():
    p, b = make()
    for i in range(3):
        b.add(prompt(i, 20), budget=400, rid=i)
    for _ in range(10):
        b.step()
    judged = {req["rid"]: list(p.rows.at[i].judged) for i, req in enumerate(b.rows)}
    b.rows.reverse()  # a batch reordered between steps (vLLM swaps rows to sort them)
    b.step()
    for i, req in enumerate(b.rows):
        r = p.rows.at[i]
        assert b.seen[req["rid"]][0] == req["seq"] and sum(r.judged) >= sum(judged[req["rid"]])
    assert p.rows.opened == 3  # nobody was taken for a new request


def test_identical_requests_are_told_apart_once_they_differ():
    p, b = make()
    b.add(prompt(1, 30), budget=200, rid=0)
    b.add(prompt(1, 30), budget=200, rid=1, twist=36)  # sampling makes the twins part at position 36
    b.step()  # their prompts' first prefill chunk: no row decodes yet
    assert b.seen == {}
    for step in range(12):
        if step % 3 == 2:
            b.rows.reverse()  # and their rows swap now and then
        b.step()
        assert len(b.seen) == 2 and all(held == true for held, true in b.seen.values())
    assert b.seen[0][1][36] != b.seen[1][1][36] and p.rows.opened == 2


def test_acceptance_counts_the_kept_drafts():
    p, _ = make()
    r = p.rows._open(np.array([1, 2, 3]), 2)
    r.draft = [4, 5, 6]
    assert r.verified([4, 5, 9]) == (3, 2)  # two kept, then the target's own token
    assert r.verified([4, 5, 6, 7]) == (3, 3)  # all kept, and a bonus
    assert r.verified([9]) == (3, 0)
    # the target's own token is the next draft token: vLLM's scheduler cut the draft there, the rest went unverified
    assert r.verified([4]) == (0, 0) and r.verified([4, 5]) == (1, 1)
    assert r.verified([]) == (0, 0)


def test_a_step_vllm_did_not_ask_for_drafts_is_not_taken_as_a_pass_cost():
    p, _ = make()

    def call(tokens: list[int], sampled: list[int]) -> None:
        ids = np.zeros((1, MAX_LEN), dtype=np.int32)
        ids[0, :len(tokens)] = tokens
        p.propose([sampled], np.array([len(tokens)]), ids)

    toks = prompt(0, 21)
    call(toks, toks[-1:])  # a new request: its prefill step is no pass cost
    for i in range(3):
        p.clock.t += 0.01
        toks = toks + [100 + i]  # tokens never seen before: nothing to look up, so one-row steps
        call(toks, toks[-1:])
    assert p.policy.cost.seen[1][1] == 3
    p.clock.t += 0.02
    toks = toks + [200, 201]  # vLLM skipped the proposer for a step (a row near the model length): two steps' tokens
    call(toks, toks[-1:])
    assert p.policy.cost.seen[1][1] == 3 and p.policy.cost.seen[1][0] == pytest.approx(0.01)


def drafted_share(p, b, steps: int) -> float:
    before = dict(p.counts)
    for _ in range(steps):
        b.step()
    rows = p.counts["rows"] - before["rows"]
    return (p.counts["drafted_rows"] - before["drafted_rows"]) / rows


def test_auto_drafts_where_a_wider_step_is_nearly_free_and_stops_where_it_is_not():
    """With row_floor 0 (the batch's throughput alone decides): a row's draft costs 2% of a step on the flat curve,
    a whole one on the steep curve."""
    flat, steep = (lambda w: 0.02 + 0.0005 * w), (lambda w: 0.01 * w)
    share = {}
    for policy, cost in (("always", flat), ("auto", flat), ("auto", steep)):
        p, b = make(policy=policy, cost=cost, row_floor=0.0)
        for i in range(4):
            b.add(prompt(i, 30), budget=MAX_LEN - 8, rid=i)
        drafted_share(p, b, 60)  # learn the curve
        share[policy, cost] = drafted_share(p, b, 100)
        if policy == "auto":
            curve = p.policy.cost.curve()
            assert curve and all(t == pytest.approx(cost(n), rel=0.05) for n, t in curve), curve
    # rows without a draft under `always` are rows the lookup found nothing for
    assert share["auto", flat] >= 0.9 * share["always", flat] > 0.5, share
    assert share["auto", steep] < 0.15, share


def test_the_policy_keeps_the_configured_row_floor():
    """0.97 unless configured (what the floor guarantees is tested on the policy: tests/test_engine_policy.py)."""
    assert make()[0].policy.row_floor == ProposerConfig().row_floor == 0.97
    assert make(row_floor=0.5)[0].policy.row_floor == 0.5


def test_never_proposes_nothing_and_always_proposes_k():
    p, b = make(policy="never")
    b.add(prompt(0, 30), budget=300, rid=0)
    for _ in range(10):
        b.step()
    assert p.counts["drafted"] == 0
    p, b = make(policy="always", k=3)
    b.add(prompt(0, 30), budget=300, rid=0)
    for _ in range(10):
        b.step()
    assert all(len(req["draft"]) <= 3 for req in b.rows) and p.counts["drafted"] > 10


def test_the_learned_cost_is_optimistic_where_it_has_not_looked():
    c = LearnedPassCost(min_seen=2)
    assert c(1) == c(50) == 1.0
    for _ in range(2):
        c.observe(4, 0.04)
        c.observe(8, 0.05)
    assert c(4) == pytest.approx(0.04) and c(8) == pytest.approx(0.05)
    assert c(6) == pytest.approx(0.04)  # between: what the narrower measured width costs, until 6 is tried
    assert c(2) == pytest.approx(0.02)  # narrower: in proportion
    assert c(40) == pytest.approx(0.05)  # wider: flat at the widest measured
    for _ in range(3):
        c.observe(6, 0.044)
    assert c(6) == pytest.approx(0.044) and c(7) == pytest.approx(0.044)  # tried, it is priced as it ran
    c.observe(0, 1.0)
    c.observe(3, 0.0)  # neither is a measure
    assert 0 not in c.seen and 3 not in c.seen


def test_drafts_keep_within_the_model_length():
    p, _ = make(policy="always", k=6)
    seq = np.array(prompt(0, MAX_LEN - 3), dtype=np.int32)
    ids = np.zeros((1, MAX_LEN), dtype=np.int32)
    ids[0, :len(seq)] = seq
    (d,) = p.propose([[int(seq[-1])]], np.array([len(seq)]), ids)
    assert len(d) <= 2


def test_configuration_from_the_environment(tmp_path):
    assert ProposerConfig.from_env({}) == ProposerConfig()
    cfg = ProposerConfig.from_env({ENV: '{"drafter": "suffix", "policy": "always", "k": 4}'})
    assert (cfg.drafter, cfg.policy, cfg.k) == ("suffix", "always", 4) and cfg.how() == Speculation("fixed", 4)
    assert ProposerConfig.from_env({ENV: '{"k": 5}'}).how() == Speculation("fixed", 5)  # as --k 5 everywhere
    assert ProposerConfig.from_env({ENV: '{"k": "auto"}'}).how() == Speculation("auto", DEFAULT_K)
    assert ProposerConfig.from_env({ENV: '{"row_floor": 1}'}).row_floor == 1.0
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps({"drafter": "ngram,suffix"}))
    assert ProposerConfig.from_env({ENV: str(f)}).drafter == "ngram,suffix"
    bad = {
        '{"drafter": "ngram", "kk": 3}': "unknown field(s) kk",
        '{"policy": "sometimes"}': "SPECDEC_VLLM: policy must be one of auto, fixed, never",
        '{"k": 0}': "SPECDEC_VLLM: k must be an integer >= 1",
        '{"policy": "fixed"}': "SPECDEC_VLLM: policy fixed drafts the same number of tokens every round: give k",
        '{"drafter": ': "not valid JSON",
        '{"drafter": 5}': "drafter has the wrong type: 5",
        '{"ngram_max": "4"}': "ngram_max has the wrong type",
        '{"row_floor": 1.5}': "row_floor must be a number in [0, 1], got 1.5",
        '{"row_floor": true}': "row_floor must be a number in [0, 1]",
        "[1]": "not a JSON object",
        str(tmp_path / "missing.json"): "no file can be read there",
    }
    for text, msg in bad.items():
        with pytest.raises(SpecdecError, match=re.escape(msg)):
            ProposerConfig.from_env({ENV: text})


def test_drafters_that_need_a_model_and_a_k_beyond_vllms_are_refused():
    with pytest.raises(SpecdecError, match="run without a model"):
        Proposer(vllm_config(), ProposerConfig(drafter="eagle"))
    with pytest.raises(SpecdecError, match="unknown drafter"):
        Proposer(vllm_config(), ProposerConfig(drafter="bogus"))
    with pytest.raises(SpecdecError, match="exceeds vLLM's num_speculative_tokens = 4"):
        Proposer(vllm_config(k=4), ProposerConfig(k=8))
    assert Proposer(vllm_config(k=4), ProposerConfig()).k == 4  # auto: the default cap, at most vLLM's
    assert Proposer(vllm_config(), ProposerConfig(drafter="none")).how == Speculation("never", 0)  # as everywhere


def test_what_a_run_learned_of_the_step_costs_seeds_the_next(tmp_path, monkeypatch, capsys):
    """The learned step costs go to the cache with each summary line; the next proposer on the same model, vLLM
    and CPU starts from them (and says so), and keeps learning."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    clock = Clock()
    p = Proposer(vllm_config(6), ProposerConfig(report_s=1e-9), clock=clock)
    b = Batch(p, clock, lambda w: 0.01 + 0.001 * w)
    b.add(prompt(0, 30), budget=300, rid=0)
    for _ in range(30):
        b.step()
    learned = p.learned.curve()
    assert learned and "pass costs learned from vLLM's step times" in capsys.readouterr().err
    again = Proposer(vllm_config(6), ProposerConfig(report_s=0), clock=Clock())
    seeded = again.learned.curve()  # as of the last summary line: within a step or two of the end
    assert [n for n, _ in seeded] == [n for n, _ in learned]
    assert [t for _, t in seeded] == pytest.approx([t for _, t in learned], rel=0.05)
    assert f"from the {len(learned)} widths the last run learned" in capsys.readouterr().err


def test_vllm_servers_listen_on_loopback_and_send_no_usage_reports(tmp_path, monkeypatch):
    from specdec.bench.serving.servers import VllmServer, cpu_range

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    s = VllmServer("x", tmp_path / "model", tmp_path, {"method": "ngram", "num_speculative_tokens": 5},
                   proposer={"drafter": "suffix"})
    cmd, env = s.command(), s.environment()
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--dtype") + 1] == "float32"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "ngram"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert json.loads(env[ENV]) == {"drafter": "suffix"} and env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_range()
    lo, hi = map(int, cpu_range().split("-"))
    assert lo <= hi and set(range(lo, hi + 1)) <= set(os.sched_getaffinity(0))


def test_a_broken_cpu_expand_in_vllms_sampler_is_replaced_and_a_working_one_kept():
    import torch

    from specdec.integrations.vllm_repair import expand_batch_to_tokens, repair_cpu_expand

    temps = torch.tensor([0.8, -1.0, 1.5])  # -1: vLLM's greedy marker, replaced by 1 as vLLM's sampler asks
    got = expand_batch_to_tokens(temps, torch.tensor([2, 3, 6], dtype=torch.int32), 6, replace_from=-1.0,
                                 replace_to=1.0)
    assert got.tolist() == pytest.approx([0.8, 0.8, 1.0, 1.5, 1.5, 1.5])
    # vllm-cpu 0.32.0's: the float output is never written (its C++ stand-in fills an int64 copy)
    broken = SimpleNamespace(expand_batch_to_tokens=lambda x, cu, n, **kw: x.new_zeros(n))
    assert repair_cpu_expand(broken) and broken.expand_batch_to_tokens is expand_batch_to_tokens
    failing = SimpleNamespace(expand_batch_to_tokens=lambda *a, **kw: 1 / 0)  # a kernel that cannot run here
    assert repair_cpu_expand(failing) and failing.expand_batch_to_tokens is expand_batch_to_tokens
    working = SimpleNamespace(expand_batch_to_tokens=expand_batch_to_tokens)
    own = lambda *a, **kw: expand_batch_to_tokens(*a, **kw)
    working.expand_batch_to_tokens = own
    assert not repair_cpu_expand(working) and working.expand_batch_to_tokens is own
    with pytest.raises(SpecdecError, match="repair must be true or false"):
        ProposerConfig(repair="no")


def test_the_vllm_plugin_repairs_only_when_asked(monkeypatch):
    from specdec.integrations import vllm_repair

    calls = []
    monkeypatch.setattr(vllm_repair, "repair_cpu_expand", lambda: calls.append(1) or False)
    monkeypatch.delenv(vllm_repair.REPAIR_ENV, raising=False)
    vllm_repair.plugin()
    assert calls == []  # installing specdec beside vLLM changes nothing by itself
    monkeypatch.setenv(vllm_repair.REPAIR_ENV, "1")
    vllm_repair.plugin()
    assert calls == [1]
