"""The forward pass on the GGUF's own blocks against the fp16 path and llama.cpp, in one run (issue 10).

    .venv/bin/python scripts/gguf_bench.py [--out docs/results/gguf-kernels] [--new-tokens 96]

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

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_context as lc  # noqa: E402  (the prompts, decode_rate and the llama.cpp runner)
import torch  # noqa: E402

from specdec.atomic import write_text_atomic  # noqa: E402
from specdec.bench.profile import measure_bandwidth, time_passes  # noqa: E402
from specdec.drafters.ngram import NgramDrafter  # noqa: E402
from specdec.engine.calibrate import policy_for  # noqa: E402
from specdec.engine.generate import Engine, GenerationConfig  # noqa: E402
from specdec.kernels import decode_kernels  # noqa: E402
from specdec.models.gguf_convert import bundled_gguf_path  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402
from specdec.runtime import encode_prompt  # noqa: E402

PATHS = ("fp16", "gguf", "gguf-q16", "gguf-q8")


def ttft(model, ids: list[int], reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        cache = model.new_cache(1, len(ids) + 8)
        t0 = time.perf_counter()
        model.forward(torch.tensor([ids]), torch.tensor([0]), cache, last_only=torch.tensor([len(ids) - 1]),
                      prefill=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_path(precision: str, prompts: dict[str, list[int]], tokenizer, new_tokens: int, rates: dict) -> dict:
    lc.log(f"{precision}: loading")
    model = load_model("default", precision).model
    edit = prompts["432"]
    engine = Engine(model, tokenizer)
    cfg = GenerationConfig(new_tokens)
    engine.generate([edit[:64]], GenerationConfig(8), None, 1)  # warm up
    plains = [engine.generate([edit], cfg, None, 1)[0] for _ in range(3)]  # the median of 3: one run is noisy
    plain = sorted(plains, key=lc.decode_rate)[1]
    ngram = engine.generate([edit], cfg, NgramDrafter(4, 1), 5)[0]
    drafter = NgramDrafter(4, 1)
    auto = engine.generate([edit], cfg, drafter, policy_for("auto", model, drafter))[0]  # generate's default
    passes = time_passes(model, 512, [1, 6], reps=15)
    one, six = statistics.median(passes[1]), statistics.median(passes[6])
    planes = (getattr(model, "act_bits", None) or 0) // 8  # int8 dot products per multiply-add (0: fp32 FMA)
    compute_floor = model.macs_per_token * planes / rates["int8"] if planes else model.macs_per_token / rates["fp32"]
    out = {
        "precision": precision, "weight_bytes_per_token": model.weight_bytes_per_token,
        # a decode step also reads the KV cache: at the mean context of the plain run, prompt + half the new tokens
        "kv_bytes_per_step": model.kv_bytes_per_token() * (len(edit) + new_tokens / 2),
        "compute_floor_s": compute_floor,
        "plain_decode_tok_s": lc.decode_rate(plain), "ngram_decode_tok_s": lc.decode_rate(ngram),
        "ngram_speedup": lc.decode_rate(ngram) / lc.decode_rate(plain), "identical": plain.token_ids == ngram.token_ids,
        "ngram_auto_tok_s": lc.decode_rate(auto), "ngram_auto_speedup": lc.decode_rate(auto) / lc.decode_rate(plain),
        "identical_auto": plain.token_ids == auto.token_ids,
        "pass_1_row_s": one, "pass_6_rows_s": six, "verify_6_cost": six / one,
        "ttft_432_s": ttft(model, prompts["432"]), "ttft_1000_s": ttft(model, prompts["1000"]),
    }
    if getattr(model, "act_bits", None) and model.kernels.cpu_has_vnni():
        out["isa"] = isa_effect(model, precision, edit)
    del model, engine
    out["pages"] = pages_effect(precision)
    lc.log(f"{precision}: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})}")
    return out


def add_floors(p: dict, bandwidth: float) -> None:
    """The memory floors of path p at `bandwidth` (bytes/s): weights alone and with the KV cache, and the share of
    the binding floor (memory or compute) that plain decoding reaches."""
    p["memory_floor_s"] = p["weight_bytes_per_token"] / bandwidth
    p["memory_floor_kv_s"] = (p["weight_bytes_per_token"] + p["kv_bytes_per_step"]) / bandwidth
    for share, floor in (("of_binding_floor", "memory_floor_s"), ("of_binding_floor_kv", "memory_floor_kv_s")):
        p[share] = max(p[floor], p["compute_floor_s"]) * p["plain_decode_tok_s"]


def isa_effect(model, precision: str, prompt: list[int], rounds: int = 4) -> dict:
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
    return {isa: {"pass_1_row_s": m["1"], "pass_6_rows_s": m["6"], "verify_6_cost": m["6"] / m["1"],
                  "ttft_s": m["ttft"]} for isa, m in med.items()}


def pages_effect(precision: str, rounds: int = 6) -> dict:
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
    return {"huge_s": huge, "small_s": small, "speedup": small / huge, "granted_mb": granted}


def huge_mb() -> float:
    """MB of this process's memory on transparent huge pages (0 where /proc does not say)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def render(r: dict) -> str:
    bw, rates = r["bandwidth_GBps"], r["rates"]
    lines = [f"# GGUF kernels: one run, {r['date']}", "",
             f"Machine: read bandwidth {bw:.1f} GB/s (a 1 GiB sum, the best of 7 before and 7 after the paths; "
             f"the lower median {r['bandwidth_median_GBps']:.1f}; the memory floors use the best); "
             f"multiply-add rate over "
             f"{r['threads']} threads: fp32 FMA {rates['fp32'] / 1e9:.0f} G/s, "
             f"int8 blocks {rates['int8'] / 1e9:.0f} G/s ({rates.get('isa', 'avx2')}). "
             f"Prompts: code edits of {r['prompt_tokens']['432']} and {r['prompt_tokens']['1000']} tokens (chat "
             f"template; the long one for TTFT only), {r['new_tokens']} new tokens, greedy.", "",
             "| path | MB read / token | memory floor ms (+ KV) | compute floor ms | plain tok/s | "
             "of binding floor (+ KV) | 6-row pass (1-row passes) | TTFT short ms | TTFT long ms | "
             "n-gram k = 5 tok/s | speedup | n-gram k auto tok/s | speedup | identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in r["paths"]:
        lines.append(f"| {p['precision']} | {p['weight_bytes_per_token'] / 1e6:.1f} | "
                     f"{p['memory_floor_s'] * 1e3:.2f} ({p['memory_floor_kv_s'] * 1e3:.2f}) | "
                     f"{p['compute_floor_s'] * 1e3:.2f} | {p['plain_decode_tok_s']:.0f} | "
                     f"{p['of_binding_floor']:.0%} ({p['of_binding_floor_kv']:.0%}) | "
                     f"{p['verify_6_cost']:.2f} | {p['ttft_432_s'] * 1e3:.0f} | {p['ttft_1000_s'] * 1e3:.0f} | "
                     f"{p['ngram_decode_tok_s']:.0f} | {p['ngram_speedup']:.2f}x | {p['ngram_auto_tok_s']:.0f} | "
                     f"{p['ngram_auto_speedup']:.2f}x | {p['identical'] and p['identical_auto']} |")
    by = {p["precision"]: p for p in r["paths"]}
    fp16 = by["fp16"]
    lines += ["", "Against the fp16 path:", ""]
    for name in PATHS[1:]:
        p = by[name]
        lines.append(f"- {name}: plain decoding {p['plain_decode_tok_s'] / fp16['plain_decode_tok_s']:.2f}x, "
                     f"prefill {fp16['ttft_432_s'] / p['ttft_432_s']:.2f}x (short prompt) and "
                     f"{fp16['ttft_1000_s'] / p['ttft_1000_s']:.2f}x (long)")
    lines += ["", "Huge pages (models/hugepages.py): a one-row pass at context 512 with the weights and KV cache on "
              "2 MB pages against 4 KB pages (SPECDEC_HUGEPAGES=0), both models loaded and timed in alternation:", ""]
    for p in r["paths"]:
        pg = p["pages"]
        lines.append(f"- {p['precision']}: {pg['huge_s'] * 1e3:.2f} ms against {pg['small_s'] * 1e3:.2f} ms "
                     f"({pg['speedup']:.2f}x; {pg['granted_mb']:.0f} MB of the model on 2 MB pages)")
    isa_paths = [p for p in r["paths"] if "isa" in p]
    if isa_paths:
        lines += ["", "The integer kernel on AVX512-VNNI (vpdpbusd, chosen at run time where the CPU has it) against "
                  "its AVX2 build (vpmaddubsw), attention's 512-bit tiles against its AVX2 ones with them, "
                  "bit-identical outputs, the two builds alternated on the same model:", ""]
        for p in isa_paths:
            a, v = p["isa"]["avx2"], p["isa"]["vnni"]
            lines.append(f"- {p['precision']}: 1-row pass {a['pass_1_row_s'] * 1e3:.2f} -> "
                         f"{v['pass_1_row_s'] * 1e3:.2f} ms, 6-row pass {a['pass_6_rows_s'] * 1e3:.2f} -> "
                         f"{v['pass_6_rows_s'] * 1e3:.2f} ms ({a['verify_6_cost']:.2f} -> {v['verify_6_cost']:.2f} "
                         f"one-row passes), TTFT {a['ttft_s'] * 1e3:.0f} -> {v['ttft_s'] * 1e3:.0f} ms")
            if "amx" in p["isa"]:
                x = p["isa"]["amx"]
                lines.append(f"  - with AMX's tiles (q16 products of 5 rows or more) against VNNI alone: 6-row pass "
                             f"{v['pass_6_rows_s'] * 1e3:.2f} -> {x['pass_6_rows_s'] * 1e3:.2f} ms "
                             f"({x['pass_6_rows_s'] / v['pass_6_rows_s']:.2f}x), TTFT {v['ttft_s'] * 1e3:.0f} -> "
                             f"{x['ttft_s'] * 1e3:.0f} ms ({x['ttft_s'] / v['ttft_s']:.2f}x)")
    lcpp = r.get("llamacpp")
    if lcpp:
        pl, lk = lcpp["plain"], lcpp["lookup"]
        lines += ["", f"llama.cpp (node-llama-cpp 3.22.1, same GGUF and prompt, {r['threads']} threads): plain "
                  f"{pl['decode_tok_s']:.0f} tok/s, TTFT {pl['ttft_s'] * 1e3:.0f} ms; its prompt lookup "
                  f"{lk['decode_tok_s']:.0f} tok/s.", ""]
        for name in PATHS:
            p = by[name]
            best = max(p['ngram_decode_tok_s'], p['ngram_auto_tok_s'])
            lines.append(f"- {name}: plain {p['plain_decode_tok_s'] / pl['decode_tok_s']:.2f}x llama.cpp's plain; "
                         f"n-gram {p['ngram_decode_tok_s'] / lk['decode_tok_s']:.2f}x its lookup at k = 5, "
                         f"{p['ngram_auto_tok_s'] / lk['decode_tok_s']:.2f}x with k auto "
                         f"(best {best / lk['decode_tok_s']:.2f}x); TTFT "
                         f"{p['ttft_432_s'] * 1e3:.0f} ms against {pl['ttft_s'] * 1e3:.0f} ms")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("docs/results/gguf-kernels"))
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args()
    kernels = decode_kernels()
    if kernels is None:
        print("the native kernels are needed", file=sys.stderr)
        return 1
    fp16 = load_model("default", "fp16")
    tok = fp16.tokenizer
    del fp16
    texts = {n: lc.long_prompts(tok, int(n))["file edit"] for n in ("432", "1000")}
    prompts = {n: encode_prompt(tok, t, chat=True) for n, t in texts.items()}
    lc.log("bandwidth and multiply-add rates")
    early = measure_bandwidth(1 << 30, 7)
    rates = {"fp32": kernels.fma_peak(0.5), "int8": kernels.int8_peak(0.5), "isa": kernels.isa()}
    paths = [measure_path(p, prompts, tok, args.new_tokens, rates) for p in PATHS]
    late = measure_bandwidth(1 << 30, 7)  # the machine drifts over a run: the floors hold at both ends
    bw = max(early["read_GBps_best"], late["read_GBps_best"]) * 1e9  # floors on the best reading: the strictest
    bw_median = min(early["read_GBps"], late["read_GBps"]) * 1e9
    for p in paths:
        add_floors(p, bw)
    lcpp = lc.measure_llamacpp(bundled_gguf_path(), texts["432"], args.new_tokens)
    r = {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": torch.get_num_threads(), "bandwidth_GBps": bw / 1e9,
         "bandwidth_median_GBps": bw_median / 1e9,
         "rates": rates, "new_tokens": args.new_tokens, "prompt_tokens": {n: len(v) for n, v in prompts.items()},
         "paths": paths, "llamacpp": lcpp}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out.with_suffix(".json"), json.dumps(r, indent=1) + "\n")
    text = render(r)
    write_text_atomic(args.out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
