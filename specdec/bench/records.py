"""The typed results of a benchmark, local or against an endpoint: what the Markdown tables, the plot and the
JSON are rendered from. Every number is defined once, in specdec.measure and specdec.bench.stats."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.bench.results import Result

OVERALL = "overall"


@dataclass
class Prediction:
    """A speedup predicted by the economics from one source of costs, and its error against the measurement."""

    speedup: float | None
    speedup_iid: float | None  # the same costs with one acceptance rate a instead of the per-position a_i
    error: float | None  # predicted / measured - 1
    error_iid: float | None


@dataclass
class GroupResult:
    """One method over a group of prompts (a category, or all of them)."""

    prompts: int
    tokens: int
    seconds: float
    tokens_per_s: float | None  # mean over the prompts, end to end
    tokens_per_pass: float | None  # per target pass; per streamed chunk for an endpoint
    drafted: int
    accepted: int
    alpha: float | None
    acceptance_by_position: list[float | None]
    draft_lengths: dict[int, int]
    ttft_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    burst_share: float | None
    disturbance_max: float | None
    # against the baseline method on the same prompts (None without one)
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    decode_speedup: float | None = None
    robust_speedup: float | None = None
    identical_rate: float | None = None
    mismatches: list[dict] = field(default_factory=list)
    timing_suspect: list[str] = field(default_factory=list)
    predictions: dict[str, Prediction] = field(default_factory=dict)  # by source of costs: "profile", "rounds"


@dataclass
class MethodResult:
    categories: dict[str, GroupResult]
    overall: GroupResult

    def group(self, name: str) -> GroupResult | None:
        return self.overall if name == OVERALL else self.categories.get(name)


@dataclass
class BenchReport(Result):
    """A bench run, as `bench --json` writes it and `plan --from-bench` reads it back (checked: Result)."""

    config: dict
    categories: list[str]
    methods: list[dict]  # name, family, k, baseline
    results: dict[str, MethodResult]
    prediction_source: str | None  # which prediction the tables show: "profile", "rounds", or None (no rounds)
    prediction_costs: str
    profile: dict | None = None
    timing: dict = field(default_factory=dict)
    drift: dict = field(default_factory=dict)
    meters: dict = field(default_factory=dict)
    auto_k: dict | None = None
    hf: dict | None = None
    llamacpp: dict | None = None  # llama.cpp next to ours on the same prompts (bench --compare llama.cpp)
    endpoint: dict | None = None  # levels, server counters, the cost points measured (bench --endpoint)
    samples: list[dict] = field(default_factory=list)
    machine: dict | None = None  # the machine that decoded (provenance; absent from the oldest recorded reports)
    verify_cost: dict | None = None  # an endpoint's measured cost points: the report reads as `plan --profile`
    samples_note: str | None = None  # a recorded summary's word on the per-prompt samples it left out

    def prediction(self, group: GroupResult) -> Prediction | None:
        return group.predictions.get(self.prediction_source) if self.prediction_source else None

    def to_json(self) -> dict:
        out = super().to_json()
        if self.endpoint and self.endpoint.get("verify_cost"):
            out["verify_cost"] = self.endpoint["verify_cost"]
        for optional in ("machine", "verify_cost", "samples_note"):
            if out.get(optional) is None:
                out.pop(optional, None)
        return out


def measured_acceptance(path: str, method: str | None) -> tuple[str, float, tuple[float, ...]]:
    """(method, a, a_i up to the last position reached) measured by a `specdec bench --json` report, read typed (a
    wrong field is named in one line): `plan --from-bench`'s reading."""
    from pathlib import Path

    from specdec.errors import SpecdecError
    from specdec.inputs import number, read_json

    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise SpecdecError(f"{path}: not a `specdec bench --json` report (no 'results' of methods with 'overall')")
    report = BenchReport.from_json(data, Path(path).name)
    measured = {name: r.overall for name, r in report.results.items() if r.overall.alpha is not None}
    for name, overall in measured.items():
        number(overall.alpha, f"{path}: results.{name}.overall.alpha", 0, 1)
    if not measured:
        raise SpecdecError(f"{path}: no method in it measured an acceptance rate")
    if method is not None and method not in measured:
        raise SpecdecError(f"{path}: no acceptance rate for method {method!r} (there: {', '.join(measured)})")
    name = method or max(measured, key=lambda m: measured[m].drafted)
    a_pos = []
    for i, a in enumerate(measured[name].acceptance_by_position):
        if a is None:
            break
        a_pos.append(number(a, f"{path}: results.{name}.overall.acceptance_by_position[{i}]", 0, 1))
    return name, measured[name].alpha, tuple(a_pos)
