"""The report of `specdec bench --kernels` (specdec.bench.hardware.kernels_bench): per precision path its floors,
decode and n-gram speeds, verify cost and time to first token; against fp16; huge pages; the integer kernel's
ISA builds; llama.cpp on the same GGUF."""

from __future__ import annotations

PATHS = ("fp16", "gguf", "gguf-q16", "gguf-q8")


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
    for name in [n for n in PATHS[1:] if n in by]:  # bench --kernels --quick measures two paths
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
        for name in [n for n in PATHS if n in by]:
            p = by[name]
            best = max(p['ngram_decode_tok_s'], p['ngram_auto_tok_s'])
            lines.append(f"- {name}: plain {p['plain_decode_tok_s'] / pl['decode_tok_s']:.2f}x llama.cpp's plain; "
                         f"n-gram {p['ngram_decode_tok_s'] / lk['decode_tok_s']:.2f}x its lookup at k = 5, "
                         f"{p['ngram_auto_tok_s'] / lk['decode_tok_s']:.2f}x with k auto "
                         f"(best {best / lk['decode_tok_s']:.2f}x); TTFT "
                         f"{p['ttft_432_s'] * 1e3:.0f} ms against {pl['ttft_s'] * 1e3:.0f} ms")
    return "\n".join(lines) + "\n"
