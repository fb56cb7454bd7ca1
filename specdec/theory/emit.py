"""`specdec plan --emit ENGINE`: the planner's choice written as a serving engine's speculative configuration.

`choose` picks the draft depth k from an acceptance rate a (or per-position conditional rates a_i) and the costs,
and the batch size where speculation stops paying when a knee is known; `emit` writes that choice for one engine.
Each emitter names the source its keys were checked against. Where an engine lacks a knob the planner has a
number for, the output says so in a comment instead of inventing a key.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from specdec.errors import SpecdecError
from specdec.theory.economics import (
    CostCurve,
    CostFn,
    check_alpha,
    check_cost,
    check_k,
    expected_tokens_positional,
    pass_cost,
    plan,
    predict_from_positional,
    unit_verify_cost,
)

METHODS = ("ngram", "draft", "eagle")
MAX_BATCH = 256  # batch sizes searched for the crossover, as `specdec batch-model` does by default


@dataclass(frozen=True)
class Choice:
    """What the planner chose, and the numbers behind it."""

    method: str                          # ngram | draft | eagle
    k: int                               # draft depth: tokens proposed per round
    draft_cost: float                    # c, in target passes per drafted token
    expected_tokens: float               # E[tokens per round] at k
    speedup: float                       # predicted decode speedup at batch 1
    min_paying_k: int | None             # smallest depth that beats plain decoding (None: none does)
    alpha: float | None = None           # single acceptance rate, if given
    acceptance: tuple[float, ...] = ()   # per-position conditional rates a_i, if given
    draft_model: str | None = None       # draft model or EAGLE head path (draft / eagle)
    ngram_min: int = 1                   # n-gram sizes of the lookup drafter (ngram)
    ngram_max: int = 4
    knee_rows: float | None = None       # token-rows per pass below which the target pass is memory-bound
    crossover_batch: int | None = None   # smallest batch at which speculation stops paying (None: never, or no knee)

    @property
    def pays(self) -> bool:  # at batch 1, by the cost curve and by the batch model
        return self.speedup > 1.0 and self.crossover_batch != 1


def parse_acceptance(text: str) -> tuple[float, ...]:
    """"0.8,0.7,0.5" -> per-position conditional acceptance rates, each in [0, 1]."""
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecdecError(f"--acceptance: expected comma-separated rates, got {text!r}") from None
    if not rates:
        raise SpecdecError("--acceptance: no rates given")
    return tuple(check_alpha(a) for a in rates)


def batch_crossover(expected: float, k: int, c: float, knee_rows: float, max_batch: int = MAX_BATCH) -> int | None:
    """economics.batch_ratio with E[tokens/round] given directly (so per-position rates work too): the smallest
    batch whose speculative throughput falls below plain decoding's."""
    if not (knee_rows > 0):
        raise SpecdecError(f"knee rows must be > 0, got {knee_rows}")
    for b in range(1, max_batch + 1):
        plain = pass_cost(b, knee_rows)
        if expected * plain / (pass_cost(b * (k + 1), knee_rows) + k * c * plain) < 1.0:
            return b
    return None


def choose(method: str, c: float, *, alpha: float | None = None, acceptance: Sequence[float] = (),
           verify_cost: CostFn = unit_verify_cost, max_k: int = 32, draft_model: str | None = None,
           ngram_min: int = 1, ngram_max: int = 4, knee_rows: float | None = None) -> Choice:
    """Best k by predicted speedup: `plan`'s geometric model for one rate a, or E = 1 + sum_i prod_{j<=i} a_j
    with the per-position rates when they are given (depths past the last measured position gain nothing)."""
    if method not in METHODS:
        raise SpecdecError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    if method in ("draft", "eagle") and not draft_model:
        raise SpecdecError(f"--method {method} needs --draft-model PATH (the draft model or EAGLE head)")
    if method == "ngram" and draft_model:
        raise SpecdecError("--draft-model is for --method draft or eagle; n-gram lookup has no model")
    if not (1 <= ngram_min <= ngram_max):
        raise SpecdecError(f"n-gram sizes need 1 <= --ngram-min <= --ngram-max, got {ngram_min}..{ngram_max}")
    if alpha is None and not acceptance:
        raise SpecdecError("give --alpha or --acceptance")
    c, max_k = check_cost(c), check_k(max_k, "max k")
    if acceptance:
        rates = [check_alpha(a) for a in acceptance]
        if isinstance(verify_cost, CostCurve):  # never extrapolate past what was measured, as plan() does
            max_k = min(max_k, verify_cost.max_rows - 1)
        curve = [(d, expected_tokens_positional(rates, d), predict_from_positional(rates, [d], c, verify_cost))
                 for d in range(1, max_k + 1)]
    else:
        p = plan(alpha, c, max_k=max_k, verify_cost=verify_cost)
        curve = [(row["k"], row["expected_tokens"], row["speedup"]) for row in p.curve]
    k, e, s = max(curve, key=lambda row: row[2])
    min_paying = next((d for d, _, sd in curve if sd > 1.0 and d <= k), None)
    crossover = batch_crossover(e, k, c, knee_rows) if knee_rows is not None else None
    return Choice(method=method, k=k, draft_cost=c, expected_tokens=e, speedup=s, min_paying_k=min_paying,
                  alpha=None if alpha is None else check_alpha(alpha), acceptance=tuple(acceptance),
                  draft_model=draft_model, ngram_min=ngram_min, ngram_max=ngram_max, knee_rows=knee_rows,
                  crossover_batch=crossover)


@dataclass
class Emitted:
    engine: str
    config: dict                                     # the engine's keys and values (--json)
    lines: list[str]                                 # the configuration as the engine takes it
    notes: list[str] = field(default_factory=list)   # what the engine cannot express, and why


def _eagle3(choice: Choice) -> bool:
    return "eagle3" in (choice.draft_model or "").lower()


def _stops_paying(choice: Choice) -> str:
    return f"the batch model says speculation stops paying at batch {choice.crossover_batch}"


def _flags(cfg: dict) -> str:
    return " ".join(f"{flag} {shlex.quote(str(v))}" for flag, v in cfg.items())


# vLLM: SpeculativeConfig fields in vllm/config/speculative.py; the batch schedule in
# https://docs.vllm.ai/en/latest/features/speculative_decoding/dynamic_speculative_decoding.html
# (vllm/v1/spec_decode/dynamic/utils.py: inclusive [bs_lo, bs_hi, K] ranges starting at 1, K >= 0).
def emit_vllm(choice: Choice) -> Emitted:
    method = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle3" if _eagle3(choice) else "eagle"}
    cfg: dict = {"method": method[choice.method], "num_speculative_tokens": choice.k}
    notes = []
    if choice.method == "ngram":
        cfg |= {"prompt_lookup_min": choice.ngram_min, "prompt_lookup_max": choice.ngram_max}
    else:
        cfg["model"] = choice.draft_model
    x = choice.crossover_batch
    if x is not None and x > 1:
        cfg["num_speculative_tokens_per_batch_size"] = [[1, x - 1, choice.k], [x, max(x, MAX_BATCH), 0]]
        notes.append(f"{_stops_paying(choice)}: K = 0 from there (larger batches keep the last entry's K)")
        if choice.method != "eagle":
            notes.append("vLLM documents the batch-size schedule as tested with EAGLE, EAGLE-3 and DFlash")
    line = "--speculative-config " + shlex.quote(json.dumps(cfg, separators=(",", ":")))
    return Emitted("vllm", cfg, [line], notes)


# SGLang: ServerArgs speculative_* fields in python/sglang/srt/server_args.py and
# https://docs.sglang.io/advanced_features/speculative_decoding.html. With top-k 1 the draft is a chain and
# num_draft_tokens = num_steps + 1 (the verified root token counts); NGRAM's draft tree also starts at the root.
def emit_sglang(choice: Choice) -> Emitted:
    notes = []
    if choice.method == "ngram":
        cfg = {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": choice.k + 1,
               "--speculative-ngram-min-bfs-breadth": 1, "--speculative-ngram-max-bfs-breadth": 1}
        notes.append(f"SGLang's NGRAM matches through a trie and has no n-gram size options (the old "
                     f"--speculative-ngram-*-match-window-size flags are gone): n = {choice.ngram_min}.."
                     f"{choice.ngram_max} is not expressed")
    else:
        algo = "STANDALONE" if choice.method == "draft" else ("EAGLE3" if _eagle3(choice) else "EAGLE")
        cfg = {"--speculative-algorithm": algo, "--speculative-draft-model-path": choice.draft_model,
               "--speculative-num-steps": choice.k, "--speculative-eagle-topk": 1,
               "--speculative-num-draft-tokens": choice.k + 1}
    if choice.crossover_batch is not None:
        notes.append(f"{_stops_paying(choice)}; SGLang has no batch-size switch for speculation, so above it "
                     "this server is slower than one without a speculative algorithm")
    return Emitted("sglang", cfg, [_flags(cfg)], notes)


# llama-server: common/arg.cpp; the flags were renamed in ggml-org/llama.cpp#22397 and #22964 (--draft-max ->
# --spec-draft-n-max, --draft-min -> --spec-draft-n-min, draft types named draft-*), docs/speculative.md.
def emit_llama_cpp(choice: Choice) -> Emitted:
    notes = ["llama.cpp renamed --draft-max/--draft-min to --spec-draft-n-max/--spec-draft-n-min (and "
             "--draft-p-min to --spec-draft-p-min, old name kept as an alias)"]
    if choice.method == "ngram":
        cfg = {"--spec-type": "ngram-simple", "--spec-ngram-simple-size-n": choice.ngram_max,
               "--spec-ngram-simple-size-m": choice.k}
        if choice.ngram_min != choice.ngram_max:
            notes.append(f"ngram-simple looks up one n-gram size: n = {choice.ngram_max} (specdec's drafter "
                         f"falls back down to n = {choice.ngram_min})")
    else:
        cfg = {"--spec-type": "draft-simple" if choice.method == "draft" else "draft-eagle3",
               "--spec-draft-model": choice.draft_model, "--spec-draft-n-max": choice.k,
               "--spec-draft-n-min": choice.min_paying_k or 1}
        notes.append("--spec-draft-n-min is the shortest draft depth that still beats plain decoding; "
                     "--spec-draft-p-min (a draft-confidence cut the planner does not model) stays at its default")
        if choice.method == "eagle":
            notes.append("llama.cpp runs EAGLE-3 heads only (draft-eagle3)")
    if choice.crossover_batch is not None:
        notes.append(f"{_stops_paying(choice)}; llama-server has no batch-size switch, so keep --parallel "
                     f"below {choice.crossover_batch} or run without speculation")
    return Emitted("llama.cpp", cfg, [_flags(cfg)], notes)


# TensorRT-LLM: DecodingBaseConfig and its subclasses in tensorrt_llm/llmapi/llm_args.py, the LLM API's
# speculative_config (https://nvidia.github.io/TensorRT-LLM/features/speculative-decoding.html); the YAML is
# what trtllm-serve --extra_llm_api_options reads.
def emit_trtllm(choice: Choice) -> Emitted:
    notes = []
    spec: dict = {"decoding_type": {"ngram": "NGram", "draft": "Draft_Target", "eagle": "Eagle3"}[choice.method],
                  "max_draft_len": choice.k}
    if choice.method == "ngram":
        spec["max_matching_ngram_size"] = choice.ngram_max
        if choice.ngram_min > 1:
            notes.append(f"TensorRT-LLM's NGram has no minimum match size: --ngram-min {choice.ngram_min} is "
                         "not expressed")
    else:
        spec["speculative_model"] = choice.draft_model
        if choice.method == "eagle" and not _eagle3(choice):
            notes.append("the PyTorch backend runs EAGLE-3 heads (decoding_type Eagle3)")
    x = choice.crossover_batch
    if x is not None and x > 1:
        spec["max_concurrency"] = x - 1
        notes.append(f"{_stops_paying(choice)}: max_concurrency turns speculation off above batch {x - 1} "
                     "(PyTorch backend)")
    lines = ["speculative_config:"] + [f"  {key}: {json.dumps(v)}" for key, v in spec.items()]
    return Emitted("trtllm", {"speculative_config": spec}, lines, notes)


EMITTERS: dict[str, Callable[[Choice], Emitted]] = {
    "vllm": emit_vllm, "sglang": emit_sglang, "llama.cpp": emit_llama_cpp, "trtllm": emit_trtllm,
}


def emit(engine: str, choice: Choice) -> Emitted:
    if engine not in EMITTERS:
        raise SpecdecError(f"--emit must be one of {', '.join(EMITTERS)}, got {engine!r}")
    return EMITTERS[engine](choice)


def numbers(choice: Choice) -> list[str]:
    """The comment lines: the numbers that went into the configuration."""
    a = f"a = {choice.alpha:g}" if choice.alpha is not None else "a = (per position)"
    out = [f"# specdec plan: method {choice.method}, {a}, c = {choice.draft_cost:g} target passes per token"]
    if choice.acceptance:
        out.append("# per-position acceptance a_i = " + ", ".join(f"{x:g}" for x in choice.acceptance))
    out.append(f"# k = {choice.k}: E[tokens/round] = {choice.expected_tokens:.3f}, "
               f"predicted speedup {choice.speedup:.2f}x at batch 1")
    if choice.knee_rows is None:
        out.append("# crossover batch: unknown (give --knee-rows or a profile with a knee)")
    elif choice.crossover_batch is None:
        out.append(f"# knee {choice.knee_rows:g} rows: speculation pays at every batch size up to {MAX_BATCH}")
    else:
        out.append(f"# knee {choice.knee_rows:g} rows: speculation stops paying at batch {choice.crossover_batch}")
    return out


def render(engine: str, choice: Choice) -> tuple[str, dict]:
    """(text, JSON object) for `plan --emit`. When no depth pays, the text says to leave speculation off and
    there is no configuration."""
    em = emit(engine, choice) if choice.pays else None
    lines = list(em.lines) if em else [
        "# speculation does not pay at these numbers: run the engine without a speculative configuration"]
    lines += numbers(choice) + [f"# note: {n}" for n in (em.notes if em else [])]
    obj = {"engine": engine, "config": em.config if em else None, "command": em.lines if em else [],
           "notes": em.notes if em else [], "choice": asdict(choice) | {"pays": choice.pays}}
    return "\n".join(lines), obj
