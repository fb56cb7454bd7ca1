"""`specdec profile`: the hardware-dependent inputs of the theory, measured on this machine.

- verify cost curve: the target's time for a pass over n = 1..max_rows token-rows at batch 1 (a decode or
  verify pass), at a few context lengths, as T(n)/T(1); medians of repeated runs, the sizes interleaved;
- draft cost c: the drafter's time per drafted token in target passes (n-gram lookup, or a draft model's
  one-token pass over the target's);
- the batch knee, memory (weights, KV per token, batch capacity lost to a draft model) and bandwidth, with
  the physical floor on time per token it implies.
The result is a JSON profile that `specdec plan --profile` and `specdec bench --profile` read.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

import torch

from specdec.engine.costs import measure_target
from specdec.errors import SpecdecError
from specdec.kernels.cores import sharing
from specdec.models.target import TargetTraits
from specdec.models.timing import Tick
from specdec.sampling.verify import PAD
from specdec.theory.economics import batch_capacity
from specdec.theory.profile import Profile


def demo_context(tokenizer, length: int) -> list[int]:
    """A realistic context for n-gram lookup: the demo's code-editing prompt, repeated to `length` tokens."""
    from specdec.engine.demo import DEMO_PROMPT
    from specdec.models.text.tokenizer import encode_prompt

    ids = encode_prompt(tokenizer, DEMO_PROMPT, chat=True) if tokenizer else list(range(1, 300))
    return (ids * (length // len(ids) + 1))[:length]


def time_ngram(drafter, context: list[int], k: int, rounds: int = 50) -> dict:
    """Seconds per propose() as the engine calls it: the context grows by 2 tokens a round."""
    half = len(context) // 2
    rounds = max(1, min(rounds, (len(context) - half) // 2))
    drafter.open(0, context[:half])
    drafter.propose([0], [context[:half]], [k])  # indexes the first half (a prefill's worth), untimed
    times, drafted = [], []
    for i in range(1, rounds + 1):
        ctx = context[: half + 2 * i]
        t0 = time.perf_counter()
        d = drafter.propose([0], [ctx], [k])
        times.append(time.perf_counter() - t0)
        drafted.append(int((d.tokens >= 0).sum()))
    # the index's memory per context token, at worst (every n-gram distinct: random tokens); it is Python dicts
    # and tuples, so tracemalloc sees all of it
    distinct = torch.randint(0, 1 << 30, (len(context),), generator=torch.Generator().manual_seed(0)).tolist()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    drafter.open(0, distinct)
    drafter.propose([0], [distinct], [k])
    index_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {"seconds_per_round": statistics.median(times), "k": k, "tokens_per_round": statistics.median(drafted),
            "context": len(context), "index_bytes_per_token": index_bytes / len(context)}


def measure_bandwidth(nbytes: int, reps: int, tick: Tick = lambda: None, kernels=None) -> dict:
    """Read bandwidth (a sum over an nbytes tensor) and copy bandwidth (read + write bytes over time); with the
    native kernels, also the rate at which their threads stream the same bytes as they stream weights (`stream`:
    what a pass's reads can reach, and what the floors are computed with)."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    x.sum(), y.copy_(x)  # warm-up: page faults
    sums, copies = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        t1 = time.perf_counter()
        y.copy_(x)
        copies.append(time.perf_counter() - t1)
        sums.append(t1 - t0)
        tick()
    n = x.numel() * 4
    stream = {}
    if kernels is not None:
        stream = {"stream_GBps": stream_rate(kernels, nbytes, reps) / 1e9}
        tick()
    return {**stream, "bytes": n, "read_GBps": n / statistics.median(sums) / 1e9, "read_GBps_best": n / min(sums) / 1e9,
            "copy_GBps": 2 * n / statistics.median(copies) / 1e9, "copy_GBps_best": 2 * n / min(copies) / 1e9,
            "method": "read: torch sum over the tensor; copy: torch copy_ into another, counting read + write"}


def stream_rate(kernels, nbytes: int, reps: int) -> float:
    """Bytes per second the kernels' threads stream (the fastest of reps sweeps over nbytes), on huge pages as the
    weights are (models/hugepages.py): on 4 KB pages the sweep read slower than 1-row passes did."""
    from specdec.models.hugepages import Arena

    buf = Arena(chunk=nbytes).empty((nbytes,), torch.uint8).fill_(1)  # written: the zero page would not be read
    return kernels.stream_read(buf, reps)


def model_memory(model) -> dict:
    read = int(model.weight_bytes_per_token)
    traits = TargetTraits.of(model)
    embed = traits.embed  # the embedding table: resident, but one row read per token
    resident = read + (embed.numel() * embed.element_size() if isinstance(embed, torch.Tensor) else 0)
    kv = traits.kv_bytes_per_token() if traits.kv_bytes_per_token is not None else None
    return {"weight_bytes_read_per_token": read, "resident_weight_bytes": resident, "kv_bytes_per_token": kv}


def memory_entry(target: dict, draft: dict | None, ngram_bytes_per_token: float, budget: float, context: int) -> dict:
    """Batch capacity at `context` tokens per sequence, without and with the drafter's memory."""
    kv_t = target["kv_bytes_per_token"] or 0
    alone = batch_capacity(budget, target["resident_weight_bytes"], kv_t, context)
    d_w = draft["resident_weight_bytes"] if draft else 0
    d_kv = (draft["kv_bytes_per_token"] or 0) if draft else ngram_bytes_per_token
    both = batch_capacity(budget, target["resident_weight_bytes"] + d_w, kv_t + d_kv, context)
    return {"target": target, "draft": draft, "drafter_bytes_per_token": d_kv, "budget_bytes": budget,
            "context": context, "sequences_without_drafter": alone, "sequences_with_drafter": both,
            "sequences_lost": alone - both, "share_lost": (alone - both) / alone if alone else None}


def planning_cost(loaded, drafter, prof: Profile, k: int) -> float:
    """c as the planners take it (bench's --policy auto, `specdec expect`): a draft model's, measured once at its
    load (runtime.build); any other drafter's, measured now at the profile's typical context (milliseconds)."""
    from specdec.drafters.draft_model import DraftModelDrafter

    if isinstance(drafter, DraftModelDrafter) and drafter.cost is not None:
        return drafter.cost.c
    return measure_draft(loaded, drafter, int(prof.typical_context or 128), prof.step_s, 3, k)[1]


def measure_draft(loaded, drafter, context: int, target_step_s: float, reps: int, k: int,
                  tick: Tick = lambda: None) -> tuple[dict, float]:
    """(what was measured, c): the drafter's cost per drafted token in target passes at `context`."""
    from specdec.drafters.draft_model import DraftModelDrafter, draft_cost
    from specdec.drafters.ngram import NgramDrafter

    if isinstance(drafter, DraftModelDrafter):
        # the two models' passes alternated: a ratio of medians taken minutes apart swung with the machine's load
        # (a tiny model as its own draft once gave c = 0.09 on a busy machine); the same measure as at load
        cost = draft_cost(loaded.model, drafter.model, context, reps, tick)
        return {"kind": "draft-model", "step_s": cost.draft_s, "context": cost.context,
                "rule": "c = the draft model's 1-token pass / the target's, alternated pass by pass, at the "
                        "typical context (drafters/draft_model.py draft_cost)"}, cost.c
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.suffix import SuffixDrafter

    members = getattr(drafter, "members", [drafter])  # a cascade costs at most its dearest member
    head = next((m for m in members if isinstance(m, EagleDrafter)), None)
    if head is not None:
        t = time_head(head, demo_context(loaded.tokenizer, context), k, reps)
        tick()
        return {"kind": drafter.name, "step_s": t, "context": context,
                "rule": "c = one drafting step of the head (its median over k-token drafts) / the target's 1-row "
                        "pass"}, t / target_step_s
    lookup = next((m for m in members if isinstance(m, (NgramDrafter, SuffixDrafter))), None)
    if lookup is not None:
        draft = {"kind": drafter.name, **time_ngram(lookup, demo_context(loaded.tokenizer, context), k),
                 "rule": "c = seconds per lookup / k / the target's 1-row pass (lookup cost is flat in k)"}
        tick()
        return draft, draft["seconds_per_round"] / k / target_step_s
    return {"kind": drafter.name}, 0.0


def time_head(drafter, context: list[int], k: int, reps: int) -> float:
    """Seconds per drafted token of a trained head after `context` (its features zeros: the cost is the same)."""
    from specdec.sampling.warp import SamplingConfig

    cutoff = drafter.min_confidence
    drafter.min_confidence = 0.0  # every step drafted: a head unsure of its drafts would stop before k
    try:
        drafter.reserve(1, len(context) + k + 1)
        drafter.open(0, context, SamplingConfig())
        drafter.features(0, 0, torch.zeros(len(context) - 1, len(drafter.taps) * drafter.head.cfg.hidden))
        drafter.propose([0], [context], [1])  # feeds the context, untimed
        times = []
        for _ in range(max(reps, 3)):
            t0 = time.perf_counter()
            d = drafter.propose([0], [context], [k])
            times.append((time.perf_counter() - t0) / max(1, int((d.tokens != PAD).sum())))
        drafter.close(0)
    finally:
        drafter.min_confidence = cutoff
    return statistics.median(times)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def profile(loaded, drafter, contexts: Sequence[int] = (128, 512, 1024), max_rows: int = 32, reps: int = 5,
            k: int = 5, bandwidth_bytes: int = 1 << 30, budget_bytes: float | None = None,
            batch_context: int | None = None, progress: bool = True, prompt_tokens: int | None = None) -> dict:
    """Measure everything; bandwidth_bytes = 0 skips bandwidth and memory (the quick profile of `bench`);
    prompt_tokens: also a prompt of that many tokens against its floor (prompt_entry)."""
    from tqdm import tqdm

    from specdec.drafters.draft_model import DraftModelDrafter

    if reps < 1 or max_rows < 2:
        raise SpecdecError(f"--reps must be >= 1 and --max-rows >= 2 (got {reps} and {max_rows})")
    model, contexts = loaded.model, sorted(set(contexts))
    if prompt_tokens:  # before the profile's minutes, not after
        check_prompt_tokens(model, prompt_tokens)
    typical = contexts[len(contexts) // 2]
    rows = list(range(1, max_rows + 1))
    draft_model = drafter.model if isinstance(drafter, DraftModelDrafter) else None
    total = len(contexts) * len(rows) * reps + (reps if draft_model else 1) + (reps + 1 if bandwidth_bytes else 0)
    team = sharing()
    changes = team.changes
    with tqdm(total=total, desc="profile", unit="pass", file=sys.stderr, disable=not progress,
              dynamic_ncols=True) as bar:
        kernels = TargetTraits.of(model).kernels
        # this machine's bandwidth moves from minute to minute: the stream is read before the passes and after them
        before = stream_rate(kernels, bandwidth_bytes, 3) if bandwidth_bytes and kernels is not None else None
        bar.set_postfix_str("target", refresh=False)
        out = measure_target(loaded, contexts, rows, reps, bar.update)
        entries = out["contexts"]
        bar.set_postfix_str(f"drafter {drafter.name}", refresh=False)
        draft, c = measure_draft(loaded, drafter, typical, out["step_s"], reps, k, bar.update)
        out.update(drafter=drafter.name, draft_cost=c, draft=draft)
        if bandwidth_bytes:
            bar.set_postfix_str("memory bandwidth", refresh=False)
            bw = measure_bandwidth(bandwidth_bytes, reps, bar.update, kernels)
            if before is not None:
                bw["stream_GBps_before"], after = before / 1e9, bw["stream_GBps"]
                bw["stream_GBps"] = max(bw["stream_GBps_before"], after)  # what the machine gave at its best
                if abs(bw["stream_GBps_before"] - after) > 0.2 * bw["stream_GBps"]:
                    print(f"specdec: the memory bandwidth moved while profiling ({bw['stream_GBps_before']:.1f} GB/s "
                          f"before the passes, {after:.1f} after): the floors take the higher; rerun on a quiet "
                          "machine to compare passes with them", file=sys.stderr)
            read = bw.get("stream_GBps", bw["read_GBps"]) * 1e9  # what a pass's reads can reach
            target_mem = model_memory(model)
            floor = target_mem["weight_bytes_read_per_token"] / read
            out["bandwidth"] = bw
            out["machine"]["bandwidth_gbs"] = round(bw["read_GBps"], 2)  # measured here: no quick probe needed
            out["floor"] = {"seconds_per_token": floor, "tokens_per_s": 1.0 / floor, "bandwidth_GBps": read / 1e9,
                            "rule": "weight bytes read per token / read bandwidth (the kernels' streaming read "
                                    "where they run)",
                            "measured_step_s": entries[0]["step_s"], "context": entries[0]["context"],
                            "measured_over_floor": entries[0]["step_s"] / floor}
            out["compute_floor"] = compute_floor(model, entries[0]["step_s"])
            if out["compute_floor"]:
                add_pass_floors(model, entries, read, out["compute_floor"]["macs_per_s"])
            out["memory"] = memory_entry(target_mem, model_memory(draft_model) if draft_model else None,
                                         draft.get("index_bytes_per_token", 0.0), budget_bytes or physical_memory(),
                                         batch_context or typical)
    if prompt_tokens:
        out["prompt"] = prompt_entry(model, prompt_tokens)
    out["team_changes"] = team.changes - changes
    if out["team_changes"]:
        print(f"specdec: the thread team changed size {out['team_changes']} time(s) while profiling (other processes "
              "used these CPUs), so the figures mix team sizes: rerun on a quiet machine, or with --threads N",
              file=sys.stderr)
    return out


def attention_rate(model, seconds: float = 0.5) -> tuple[float | None, str]:
    """Attention's multiply-add rate on the model's KV cache type, and its name: the int8 dot products' over q8_0 and
    q4_0 (their scores and value sums are integer, kernels/attention_q.inc), None (the fp32 FMA rate) over f16."""
    traits = TargetTraits.of(model)
    if (traits.kv_cache or "f16") == "f16":
        return None, "fp32 FMA"
    return traits.kernels.int8_peak(seconds), f"int8 dot products ({traits.kv_cache} cache)"


def add_pass_floors(model, entries: list[dict], bandwidth: float, product_rate: float, seconds: float = 0.5) -> None:
    """Each context entry's floor per width (theory/floor.py), in seconds, and each measured pass over its floor."""
    from specdec.theory.floor import PassWork, Rates, pass_floor

    traits = TargetTraits.of(model)
    att_rate, att_name = attention_rate(model, seconds)
    rates = Rates(bandwidth, product_rate, traits.kernels.fma_peak(seconds), att_rate)
    for e in entries:
        att, kv = model.attention_work(e["context"])
        work = PassWork(traits.weight_bytes_per_token, kv, traits.macs_per_token, att, model.elementwise_per_token())
        floors = {n: pass_floor(int(n), work, rates) for n in e["times_s"]}
        e["floor_s"] = {n: f.seconds for n, f in floors.items()}
        e["over_floor"] = {n: e["times_s"][n] / f.seconds for n, f in floors.items()}
        e["floor_binds"] = {n: f.binds for n, f in floors.items()}
    entries[0]["floor_rule"] = ("max(weight + KV bytes / read bandwidth, rows x products' multiply-adds / their "
                                f"rate) + rows x (attention's multiply-adds / the {att_name} rate "
                                f"({rates.attention / 1e9:.0f} G/s) + elementwise work / the fp32 FMA rate "
                                f"({rates.fma_rate / 1e9:.0f} G/s)); theory/floor.py")


def check_prompt_tokens(model, tokens: int) -> None:
    """A one-line SpecdecError unless a prompt of `tokens` tokens can be timed against its floor on this model."""
    if TargetTraits.of(model).kernels is None:
        raise SpecdecError("--prompt-tokens needs the native kernels (its floor counts their rates)")
    limit = model.cfg.max_position_embeddings
    if not 1 <= tokens < limit:
        raise SpecdecError(f"--prompt-tokens must be in 1..{limit - 1} for this model, got {tokens}")


def prompt_entry(model, tokens: int, reps: int = 2, seconds: float = 0.5) -> dict:
    """A prompt of `tokens` tokens: its floor (theory/floor.py prompt_floor: the products at their rate, attention
    at its cache type's) and its prefill timed (the fastest of `reps`, random tokens: a prefill's arithmetic does
    not depend on them), as time to first token is."""
    from specdec.theory.floor import Rates, kept_ceiling, prompt_floor

    check_prompt_tokens(model, tokens)
    traits = TargetTraits.of(model)
    cf = compute_floor(model, 1.0, seconds)
    att_rate, att_name = attention_rate(model, seconds)
    rates = Rates(0.0, cf["macs_per_s"], traits.kernels.fma_peak(seconds), att_rate)
    attention = sum(model.attention_work(p)[0] for p in range(1, tokens + 1))
    head = model.cfg.vocab_size * model.cfg.hidden_size
    floor = prompt_floor(tokens, cf["macs_per_token"], head, attention, rates)
    ids = torch.randint(100, model.cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(reps):
        cache = model.new_cache(1, tokens + 1)
        t0 = time.perf_counter()
        model.forward(ids, torch.zeros(1, dtype=torch.long), cache, last_only=torch.tensor([tokens - 1]), prefill=True)
        times.append(time.perf_counter() - t0)
        del cache
    kept = {}
    if traits.kv_bytes_per_token is not None:  # decoding after the prompt at the memory floor: the most of an empty
        # cache's speed its bytes allow (theory/floor.py)
        weights, per_position = float(model.weight_bytes_per_token), float(traits.kv_bytes_per_token())
        kept = {"kept_ceiling": kept_ceiling(weights, per_position, 0, tokens), "weight_bytes": weights,
                "kv_bytes_per_position": per_position}
    return {"tokens": tokens, "floor_s": floor.seconds, "products_s": floor.products_s, **kept,
            "attention_s": floor.attention_s, "attention_macs": attention, "attention_rate": rates.attention,
            "attention_arithmetic": att_name, "products_rate": rates.product_rate, "prefill_s": min(times),
            "over_floor": min(times) / floor.seconds, "kv_cache": traits.kv_cache or "f16",
            "rule": "every position's products at their rate (the LM head once) + its attention over the positions "
                    f"up to it at the {att_name} rate; the prefill: the fastest of {reps}, random tokens"}


def compute_floor(model, step_s: float, seconds: float = 0.5) -> dict | None:
    """Multiply-adds per token over the peak rate of this machine's vector units for the model's arithmetic: fp32
    FMAs (fp16, gguf), or int8 dot products (gguf-q8; gguf-q16 issues two a multiply-add, one per plane), each at the
    widest vector the kernels run here (kernels' fma_peak, int8_peak: 512 bits with AVX-512, where an Intel core or a
    Zen 5 runs twice the 256-bit rate). The kernels' own instruction mix reaches it at best, so no vector kernel's
    pass beats its floor. AMX's tiles, where a prefill's products and attention run on such a CPU, peak far higher
    than the vector units (about 3 T int8 multiply-adds a second a core on an AMX Xeon) but need their operands
    loaded and their sums scaled: the floors count the vector units, which the tiled products do not outrun
    (docs/results/kv-cache-long-context.md). None without the native kernels."""
    traits = TargetTraits.of(model)
    kernels, macs, act_bits = traits.kernels, traits.macs_per_token, traits.act_bits
    if kernels is None or macs is None:
        return None
    if act_bits:
        planes = act_bits // 8  # q16 holds its activations in two int8 planes
        rate = kernels.int8_peak(seconds) / planes
        arithmetic = f"int8 dot products, {kernels.isa()} build ({planes} activation plane(s))"
    else:
        rate, arithmetic = kernels.fma_peak(seconds), "fp32 FMA"
    floor = macs / rate
    return {"macs_per_token": macs, "macs_per_s": rate, "arithmetic": arithmetic,
            "seconds_per_token": floor, "measured_step_s": step_s, "measured_over_floor": step_s / floor,
            "rule": "multiply-adds of the matrix products per token / the multiply-add rate of all threads"}
