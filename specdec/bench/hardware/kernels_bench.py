"""`specdec bench kernels`: the forward pass on the GGUF's own blocks against the fp16 path and llama.cpp, in
one run (issue 10). Writes OUT/gguf-kernels.json (with the machine's provenance) and .md
(specdec.bench.hardware.kernels_report).

Per precision path (fp16, gguf, gguf-q16, gguf-q8) on the bundled SmolLM2-135M Q4_1 GGUF: bytes of weights read per
token, the memory floor at this machine's read bandwidth (the weights alone, and with the KV cache a step reads at the
run's mean context) and the compute floor at its multiply-add rate (both measured here, now), plain decoding and
n-gram speculation (k = 5, and k auto as `generate` does) on a code-edit prompt of up to 432 tokens, the cost of a
6-row verify pass in 1-row passes, time to first token on it and on one of up to 1,000 tokens, and a one-row pass
with the weights and KV cache on 2 MB pages against 4 KB pages, side by side; on a CPU with AVX512-VNNI, the integer
paths on that build and on the AVX2 one, side by side. Then llama.cpp (node-llama-cpp, when
installed) on the same GGUF and prompt: plain and its prompt lookup.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from specdec.bench.hardware.kernels_report import PATHS, IsaTimes, KernelsRun, PageEffect, PathResult
from specdec.bench.hardware.long_context import decode_rate, file_edit_prompt, log
from specdec.bench.hardware.profile import measure_bandwidth
from specdec.bench.results import encode
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.calibrate import policy_for
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.speculation import Speculation
from specdec.errors import SpecdecError
from specdec.models.loader import load_model
from specdec.models.target import TargetTraits
from specdec.models.text.tokenizer import encode_prompt
from specdec.models.timing import time_passes

QUICK_PATHS = ("fp16", "gguf-q16")


def ttft(model, ids: list[int], reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        cache = model.new_cache(1, len(ids) + 8)
        t0 = time.perf_counter()
        model.forward(torch.tensor([ids]), torch.tensor([0]), cache, last_only=torch.tensor([len(ids) - 1]),
                      prefill=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_path(precision: str, prompts: dict[str, list[int]], tokenizer, new_tokens: int, rates: dict,
                 quick: bool = False) -> PathResult:
    """One precision path; quick: one plain run instead of the median of 3, fewer repetitions everywhere."""
    log(f"{precision}: loading")
    loaded = load_model("default", precision)
    model = loaded.model
    edit = prompts["432"]
    engine = Engine(model, tokenizer)
    cfg = GenerationConfig(new_tokens)
    engine.generate([edit[:64]], GenerationConfig(8), None, 1)  # warm up
    plains = [engine.generate([edit], cfg, None, 1)[0] for _ in range(1 if quick else 3)]  # one run is noisy
    plain = sorted(plains, key=decode_rate)[len(plains) // 2]
    ngram = engine.generate([edit], cfg, NgramDrafter(4, 1), 5)[0]
    drafter = NgramDrafter(4, 1)
    auto = engine.generate([edit], cfg, drafter, policy_for(Speculation(), loaded, drafter))[0]  # generate's default
    passes = time_passes(model, 512, [1, 6], reps=3 if quick else 15)
    one, six = statistics.median(passes[1]), statistics.median(passes[6])
    planes = (TargetTraits.of(model).act_bits or 0) // 8  # int8 dot products per multiply-add (0: fp32 FMA)
    compute_floor = model.macs_per_token * planes / rates["int8"] if planes else model.macs_per_token / rates["fp32"]
    out = PathResult(
        precision=precision, weight_bytes_per_token=model.weight_bytes_per_token,
        # a decode step also reads the KV cache: at the mean context of the plain run, prompt + half the new tokens
        kv_bytes_per_step=model.kv_bytes_per_token() * (len(edit) + new_tokens / 2), compute_floor_s=compute_floor,
        plain_decode_tok_s=decode_rate(plain), ngram_decode_tok_s=decode_rate(ngram),
        ngram_speedup=decode_rate(ngram) / decode_rate(plain), identical=plain.token_ids == ngram.token_ids,
        ngram_auto_tok_s=decode_rate(auto), ngram_auto_speedup=decode_rate(auto) / decode_rate(plain),
        identical_auto=plain.token_ids == auto.token_ids, pass_1_row_s=one, pass_6_rows_s=six, verify_6_cost=six / one,
        ttft_432_s=ttft(model, prompts["432"]), ttft_1000_s=ttft(model, prompts["1000"]))
    if TargetTraits.of(model).act_bits and model.kernels.cpu_has_vnni():
        out.isa = isa_effect(model, precision, edit, 1 if quick else 4)
    del model, engine
    out.pages = pages_effect(precision, 2 if quick else 6)
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in encode(out).items()}
    log(f"{precision}: {json.dumps(shown)}")
    return out


def isa_effect(model, precision: str, prompt: list[int], rounds: int = 4) -> dict[str, IsaTimes]:
    """The integer kernel's builds on the same weights, alternated: 1- and 6-row passes at context 512 and the
    prefill of `prompt`, on AVX2 (vpmaddubsw), on AVX512-VNNI (vpdpbusd) and, where the CPU has AMX-INT8, with the
    q16 products of 5 rows or more on AMX's tiles. Each build runs a copy of the model loaded while it was selected,
    so in the layout a machine with only that build gets (the VNNI and AMX builds' weights in pairs of groups, one
    copy for both). Their outputs are bit-identical."""
    kernels = model.kernels
    isas = ("avx2", "vnni", "amx") if kernels.cpu_has_amx() and model.act_bits == 16 else ("avx2", "vnni")
    times: dict[str, dict[str, list]] = {isa: {"1": [], "6": [], "ttft": []} for isa in isas}
    before = kernels.set_isa("avx2")
    try:
        models = {"avx2": load_model("default", precision).model, "vnni": model, "amx": model}
        for i in range(rounds):
            for isa in isas if i % 2 == 0 else isas[::-1]:
                kernels.set_isa(isa)
                passes = time_passes(models[isa], 512, [1, 6], reps=5)
                times[isa]["1"] += passes[1]
                times[isa]["6"] += passes[6]
                times[isa]["ttft"].append(ttft(models[isa], prompt, reps=1))
    finally:
        kernels.set_isa(before)
    med = {isa: {k: statistics.median(v) for k, v in t.items()} for isa, t in times.items()}
    return {isa: IsaTimes(m["1"], m["6"], m["6"] / m["1"], m["ttft"]) for isa, m in med.items()}


def pages_effect(precision: str, rounds: int = 6) -> PageEffect:
    """A one-row pass at context 512 with the weights and KV cache on 2 MB pages and on 4 KB pages
    (SPECDEC_HUGEPAGES=0), the two models loaded side by side and timed in alternation."""
    models, before = {}, huge_mb()
    times: dict[str, list] = {"1": [], "0": []}
    try:
        for flag in ("1", "0"):
            os.environ["SPECDEC_HUGEPAGES"] = flag
            models[flag] = load_model("default", precision).model
            if flag == "1":
                granted = huge_mb() - before  # what the kernel backed with 2 MB pages (they are best effort)
        for i in range(rounds):
            for flag in ("1", "0") if i % 2 == 0 else ("0", "1"):
                os.environ["SPECDEC_HUGEPAGES"] = flag  # time_passes makes a KV cache: on the same pages
                times[flag] += time_passes(models[flag], 512, [1], reps=5)[1]
    finally:
        os.environ.pop("SPECDEC_HUGEPAGES", None)
    huge, small = statistics.median(times["1"]), statistics.median(times["0"])
    return PageEffect(huge, small, small / huge, granted)


def huge_mb() -> float:
    """MB of this process's memory on transparent huge pages (0 where /proc does not say)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_kernels_bench(args) -> int:
    """args: out (a folder: gguf-kernels.json and .md go there), max_new_tokens, quick (a smoke test: fp16 and
    gguf-q16 only, fewer repetitions)."""
    from specdec.atomic import write_text_atomic
    from specdec.bench.engines.llamacpp_compare import plain_and_lookup
    from specdec.bench.hardware.kernels_report import render
    from specdec.kernels import decode_kernels
    from specdec.models.gguf.convert import bundled_gguf_path
    from specdec.provenance import provenance

    kernels = decode_kernels()
    if kernels is None:
        raise SpecdecError("bench kernels measures the native kernels, and they are not available here")
    fp16 = load_model("default", "fp16")
    tok = fp16.tokenizer
    del fp16
    texts = {n: file_edit_prompt(tok, int(n)) for n in ("432", "1000")}
    prompts = {n: encode_prompt(tok, t, chat=True) for n, t in texts.items()}
    log("bandwidth and multiply-add rates")
    bw_reps = 2 if args.quick else 7
    early = measure_bandwidth(1 << 30, bw_reps)
    rates = {"fp32": kernels.fma_peak(0.5), "int8": kernels.int8_peak(0.5), "isa": kernels.isa()}
    paths = [measure_path(p, prompts, tok, args.max_new_tokens, rates, args.quick)
             for p in (QUICK_PATHS if args.quick else PATHS)]
    late = measure_bandwidth(1 << 30, bw_reps)  # the machine drifts over a run: the floors hold at both ends
    bw = max(early["read_GBps_best"], late["read_GBps_best"]) * 1e9  # floors on the best reading: the strictest
    bw_median = min(early["read_GBps"], late["read_GBps"]) * 1e9
    for p in paths:
        p.add_floors(bw)
    lcpp = plain_and_lookup(bundled_gguf_path(), texts["432"], args.max_new_tokens, torch.get_num_threads(), log)
    machine = provenance()
    machine["bandwidth_gbs"] = round(bw / 1e9, 2)
    r = KernelsRun(date=time.strftime("%Y-%m-%d %H:%M"), threads=torch.get_num_threads(), bandwidth_GBps=bw / 1e9,
                   bandwidth_median_GBps=bw_median / 1e9, rates=rates, new_tokens=args.max_new_tokens,
                   prompt_tokens={n: len(v) for n, v in prompts.items()}, paths=paths, llamacpp=lcpp, machine=machine)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r.save(out / "gguf-kernels.json")
    text = render(r)
    write_text_atomic(out / "gguf-kernels.md", text)
    print(text)
    return 0
