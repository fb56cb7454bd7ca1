"""The typed results of measuring whole models in processes of their own: one model by specdec
(real_models_child writes a SpecdecRun), the same file by llama.cpp (real_models.llamacpp), and `specdec
real-models`' report of them (RealModelsRun, rendered by real_models_page). The map-weights bench reads SpecdecRuns
too; a draft-model pair's run (draft_pair.py, rendered by draft_pair_page) is here too."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.bench.results import Result

Rss = dict[str, int]  # bytes: RssAnon (heap), RssFile (mapped file pages), VmHWM (peak), VmRSS


@dataclass
class DecodeRun:
    """One greedy generation. Decode rate: tokens after the first over the time after the first. llama.cpp's runs
    carry no draft counts."""

    tokens: int
    finish: str | None
    ttft_s: float | None
    seconds: float | None
    decode_tokens_per_s: float | None
    itl_tokens_per_s: float | None  # 1 / the median inter-token gap
    token_ids: list[int]
    wall_s: float | None = None
    tokens_per_s: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    alpha: float | None = None
    tokens_per_pass: float | None = None


@dataclass
class VerifyCurve:
    """Passes of 1..n rows after `context` cached tokens."""

    context: int
    reps: int
    rule: str  # how the reps are reduced: "fastest of reps"
    times_s: dict[str, float]  # rows -> seconds
    cost: dict[str, float]  # rows -> T(n) / T(1)
    step_s: float  # T(1)
    median_times_s: dict[str, float]


@dataclass
class Experts:
    """A mixture of experts: the distinct experts a verify pass read per layer, by rows in the pass."""

    per_layer: int
    per_token: int
    touched: dict[str, float]


@dataclass
class TtftRun:
    prompt_tokens: int
    ttft_s: float
    wall_s: float | None = None


@dataclass
class SpecdecRun(Result):
    """One model measured by specdec (real_models_child's JSON)."""

    model: str
    name: str
    precision: str | None
    threads: int
    load_s: float
    rss_before_load: Rss
    rss_after_load: Rss
    prompt_ids: list[int]
    chat_template: bool
    ignore_eos: bool
    weight_bytes_per_token: float
    plain: DecodeRun | None = None
    ngram: DecodeRun | None = None  # with --ngram: k auto, as `specdec generate`
    verify: VerifyCurve | None = None
    experts: Experts | None = None
    ttft_ids_len: int | None = None
    ttft: TtftRun | None = None
    lookup: dict | None = None  # with --lookup-cost: bench.hardware.profile.time_ngram on the demo context
    rss_end: Rss = field(default_factory=dict)


@dataclass
class LlamacppRun:
    """The same file by llama.cpp's worker: plain greedy decoding of the same token ids, its TTFT."""

    load_s: float
    info: dict  # the worker's own description: versions, context size, threads
    rss_after_load: Rss
    plain: DecodeRun | None = None
    ttft: TtftRun | None = None
    rss_end: Rss = field(default_factory=dict)


@dataclass
class NgramProjection:
    """PROJECTED: one Spec-Bench category's n-gram speedup on a model's curve (real_models_page.projections)."""

    alpha: float | None
    rounds: float  # the rounds model on the fixed-k run
    plan_k: int
    plan: float  # the planner's best speedup at one rate a
    rounds_auto: float | None = None  # the rounds model on the `--k auto` run (runs before 2026-12-04 lack it)


@dataclass
class DraftProjection:
    k: int
    speedup: float


@dataclass
class Projections:
    c_ngram: float  # a drafted token's lookup, in target passes
    c_draft: float  # the bundled 135M model's pass over the target's
    acceptance: str  # the Spec-Bench run the rates come from
    ngram: dict[str, NgramProjection]  # by category, and "overall"
    draft: dict[str, DraftProjection]  # by the assumed acceptance rate a
    acceptance_auto: str | None = None


@dataclass
class ShapeRun:
    """One file measured by both engines, one after the other."""

    file: str
    file_bytes: int
    specdec: SpecdecRun
    llamacpp: LlamacppRun
    floor_tokens_per_s: float  # read bandwidth over the bytes a token reads
    load_before: list[float]  # load averages (1, 5, 15 min)
    load_after: list[float]
    projections: Projections | None = None


@dataclass
class DepthProjection:
    """PROJECTED: a shape measured at a few depths (its first L layers), fitted linearly in L and read at its own."""

    layers: int
    from_depths: list[int] = field(metadata={"json": "from"})
    specdec_tokens_per_s: float
    llamacpp_tokens_per_s: float
    times_s: dict[str, float]
    step_s: float
    cost: dict[str, float]
    passes_grow: bool  # a 1-row pass took longer at more layers (else the fit is noise)
    projections: Projections | None = None


@dataclass
class RealModelsRun(Result):
    """`specdec real-models`: real-models.json, saved after each model so that a run cut short keeps its models."""

    machine: dict  # provenance, with load_end added at each save
    config: dict  # the command's arguments
    bandwidth: dict  # bench.hardware.profile.measure_bandwidth, with floor_GBps: the best reading so far
    bandwidth_runs: list[float] = field(default_factory=list)  # GB/s: at the start and before each model
    bundled: SpecdecRun | None = None
    shapes: dict[str, ShapeRun] = field(default_factory=dict)
    gemma: ShapeRun | None = None
    depths: dict[str, DepthProjection] | None = None

    def models(self) -> dict[str, ShapeRun]:
        """The shapes, then Gemma 3 270M (real weights) where the run measured it."""
        return {**self.shapes, **({"gemma-3-270m (real)": self.gemma} if self.gemma else {})}


@dataclass
class PairProjection:
    """PROJECTED at one acceptance rate a: each drafter's best k on the measured curve and its speedup."""

    draft_k: int
    draft_speedup: float
    ngram_k: int
    ngram_speedup: float


@dataclass
class DraftPairRun(Result):
    machine: dict  # provenance, with the read bandwidth
    config: dict  # the command's arguments
    target: str
    draft: str
    target_bytes: int
    draft_bytes: int
    target_precision: str
    draft_precision: str
    vocabulary: int  # tokens both tokenizers hold, id for id (runtime.build refused the pair otherwise)
    load_s: float  # both models, the tokenizer check and c at load
    c_at_load: dict  # DraftCost as `generate` and `serve` measure it at load
    c_runs: list[dict]  # DraftCost of each repeat, at the verify curve's context
    c: float  # the median of c_runs
    verify: list[VerifyCurve]  # one per repeat
    cost: dict[str, float]  # rows -> T(n) / T(1): each row count's fastest pass over all repeats
    step_s: float  # the fastest 1-row pass
    lookup: dict  # bench.hardware.profile.time_ngram on the demo context
    c_ngram: float  # a drafted token's lookup, in target passes
    projections: dict[str, PairProjection]  # by a
    plain: DecodeRun
    fixed: DecodeRun  # with the draft, k fixed: every round drafts and verifies
    auto: DecodeRun  # with the draft, --k auto (the default)
    identical: bool  # both speculative runs' tokens are the plain run's
    load_avg: list[list[float]] = field(default_factory=list)  # (1, 5, 15 min) at the start and after each part
    team_changes: int = 0  # the thread team changed size this often (other processes used these cores)
