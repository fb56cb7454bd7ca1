"""The report of `specdec bench kernels` (specdec.bench.hardware.kernels_bench): per precision path its floors,
decode and n-gram speeds, verify cost and time to first token; against fp16; huge pages; the integer kernel's
ISA builds; llama.cpp on the same GGUF."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.bench.engines.llamacpp_compare import PlainAndLookup
from specdec.bench.results import Result

PATHS = ("fp16", "gguf", "gguf-q16", "gguf-q8")


@dataclass
class IsaTimes:
    """One build of the integer kernel on one path (kernels_bench.isa_effect)."""

    pass_1_row_s: float
    pass_6_rows_s: float
    verify_6_cost: float  # pass_6_rows_s / pass_1_row_s
    ttft_s: float


@dataclass
class PageEffect:
    """A one-row pass at context 512 on 2 MB pages against 4 KB pages (kernels_bench.pages_effect)."""

    huge_s: float
    small_s: float
    speedup: float  # small_s / huge_s
    granted_mb: float  # of the model on 2 MB pages


@dataclass
class PathResult:
    """One precision path (kernels_bench.measure_path; the floors added by add_floors once bandwidth is known)."""

    precision: str
    weight_bytes_per_token: float
    kv_bytes_per_step: float  # the KV cache a step reads at the plain run's mean context
    compute_floor_s: float
    plain_decode_tok_s: float
    ngram_decode_tok_s: float
    ngram_speedup: float
    identical: bool
    ngram_auto_tok_s: float
    ngram_auto_speedup: float
    identical_auto: bool
    pass_1_row_s: float
    pass_6_rows_s: float
    verify_6_cost: float
    ttft_432_s: float
    ttft_1000_s: float
    pages: PageEffect | None = None
    isa: dict[str, IsaTimes] | None = None  # "avx2", "vnni" (and "amx"): where the CPU has AVX512-VNNI
    memory_floor_s: float | None = None
    memory_floor_kv_s: float | None = None
    of_binding_floor: float | None = None
    of_binding_floor_kv: float | None = None

    def add_floors(self, bandwidth: float) -> None:
        """The memory floors at `bandwidth` (bytes/s): weights alone and with the KV cache, and the share of the
        binding floor (memory or compute) that plain decoding reaches."""
        self.memory_floor_s = self.weight_bytes_per_token / bandwidth
        self.memory_floor_kv_s = (self.weight_bytes_per_token + self.kv_bytes_per_step) / bandwidth
        self.of_binding_floor = max(self.memory_floor_s, self.compute_floor_s) * self.plain_decode_tok_s
        self.of_binding_floor_kv = max(self.memory_floor_kv_s, self.compute_floor_s) * self.plain_decode_tok_s


@dataclass
class KernelsRun(Result):
    """`specdec bench kernels`: gguf-kernels.json."""

    date: str
    threads: int
    bandwidth_GBps: float  # the best reading, before and after the paths: the floors use it
    bandwidth_median_GBps: float
    rates: dict[str, float | str]  # fp32 and int8 multiply-adds per second, and the integer kernel's isa
    new_tokens: int
    prompt_tokens: dict[str, int]  # "432", "1000": the two prompts' lengths
    paths: list[PathResult]
    llamacpp: PlainAndLookup | None = None
    machine: dict = field(default_factory=dict)  # provenance (runs before 2026-12-02 lack it)


def render(r: KernelsRun) -> str:
    bw, rates = r.bandwidth_GBps, r.rates
    lines = [f"# GGUF kernels: one run, {r.date}", "",
             f"Machine: read bandwidth {bw:.1f} GB/s (a 1 GiB sum, the best of 7 before and 7 after the paths; "
             f"the lower median {r.bandwidth_median_GBps:.1f}; the memory floors use the best); "
             f"multiply-add rate over "
             f"{r.threads} threads: fp32 FMA {rates['fp32'] / 1e9:.0f} G/s, "
             f"int8 dot products {rates['int8'] / 1e9:.0f} G/s ({rates.get('isa', 'avx2')}). "
             f"Prompts: code edits of {r.prompt_tokens['432']} and {r.prompt_tokens['1000']} tokens (chat "
             f"template; the long one for TTFT only), {r.new_tokens} new tokens, greedy.", "",
             "| path | MB read / token | memory floor ms (+ KV) | compute floor ms | plain tok/s | "
             "of binding floor (+ KV) | 6-row pass (1-row passes) | TTFT short ms | TTFT long ms | "
             "n-gram k = 5 tok/s | speedup | n-gram k auto tok/s | speedup | identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in r.paths:
        lines.append(f"| {p.precision} | {p.weight_bytes_per_token / 1e6:.1f} | "
                     f"{p.memory_floor_s * 1e3:.2f} ({p.memory_floor_kv_s * 1e3:.2f}) | "
                     f"{p.compute_floor_s * 1e3:.2f} | {p.plain_decode_tok_s:.0f} | "
                     f"{p.of_binding_floor:.0%} ({p.of_binding_floor_kv:.0%}) | "
                     f"{p.verify_6_cost:.2f} | {p.ttft_432_s * 1e3:.0f} | {p.ttft_1000_s * 1e3:.0f} | "
                     f"{p.ngram_decode_tok_s:.0f} | {p.ngram_speedup:.2f}x | {p.ngram_auto_tok_s:.0f} | "
                     f"{p.ngram_auto_speedup:.2f}x | {p.identical and p.identical_auto} |")
    by = {p.precision: p for p in r.paths}
    fp16 = by["fp16"]
    lines += ["", "Against the fp16 path:", ""]
    for name in [n for n in PATHS[1:] if n in by]:  # bench kernels --quick measures two paths
        p = by[name]
        lines.append(f"- {name}: plain decoding {p.plain_decode_tok_s / fp16.plain_decode_tok_s:.2f}x, "
                     f"prefill {fp16.ttft_432_s / p.ttft_432_s:.2f}x (short prompt) and "
                     f"{fp16.ttft_1000_s / p.ttft_1000_s:.2f}x (long)")
    lines += ["", "Huge pages (models/hugepages.py): a one-row pass at context 512 with the weights and KV cache on "
              "2 MB pages against 4 KB pages (SPECDEC_HUGEPAGES=0), both models loaded and timed in alternation:", ""]
    for p in r.paths:
        if p.pages:
            pg = p.pages
            lines.append(f"- {p.precision}: {pg.huge_s * 1e3:.2f} ms against {pg.small_s * 1e3:.2f} ms "
                         f"({pg.speedup:.2f}x; {pg.granted_mb:.0f} MB of the model on 2 MB pages)")
    lines += isa_lines(r.paths)
    if r.llamacpp:
        lines += llamacpp_lines(r, by)
    return "\n".join(lines) + "\n"


def isa_lines(paths: list[PathResult]) -> list[str]:
    isa_paths = [p for p in paths if p.isa]
    if not isa_paths:
        return []
    lines = ["", "The integer kernel on AVX512-VNNI (vpdpbusd, chosen at run time where the CPU has it) against "
             "its AVX2 build (vpmaddubsw), attention's 512-bit tiles against its AVX2 ones with them, "
             "bit-identical outputs, the two builds alternated on the same model:", ""]
    for p in isa_paths:
        a, v = p.isa["avx2"], p.isa["vnni"]
        lines.append(f"- {p.precision}: 1-row pass {a.pass_1_row_s * 1e3:.2f} -> "
                     f"{v.pass_1_row_s * 1e3:.2f} ms, 6-row pass {a.pass_6_rows_s * 1e3:.2f} -> "
                     f"{v.pass_6_rows_s * 1e3:.2f} ms ({a.verify_6_cost:.2f} -> {v.verify_6_cost:.2f} "
                     f"one-row passes), TTFT {a.ttft_s * 1e3:.0f} -> {v.ttft_s * 1e3:.0f} ms")
        if "amx" in p.isa:
            x = p.isa["amx"]
            lines.append(f"  - with AMX's tiles (q16 products of 5 rows or more) against VNNI alone: 6-row pass "
                         f"{v.pass_6_rows_s * 1e3:.2f} -> {x.pass_6_rows_s * 1e3:.2f} ms "
                         f"({x.pass_6_rows_s / v.pass_6_rows_s:.2f}x), TTFT {v.ttft_s * 1e3:.0f} -> "
                         f"{x.ttft_s * 1e3:.0f} ms ({x.ttft_s / v.ttft_s:.2f}x)")
    return lines


def llamacpp_lines(r: KernelsRun, by: dict[str, PathResult]) -> list[str]:
    pl, lk = r.llamacpp.plain, r.llamacpp.lookup
    lines = ["", f"llama.cpp (node-llama-cpp 3.22.1, same GGUF and prompt, {r.threads} threads): plain "
             f"{pl.decode_tok_s:.0f} tok/s, TTFT {pl.ttft_s * 1e3:.0f} ms; its prompt lookup "
             f"{lk.decode_tok_s:.0f} tok/s.", ""]
    for name in [n for n in PATHS if n in by]:
        p = by[name]
        best = max(p.ngram_decode_tok_s, p.ngram_auto_tok_s)
        lines.append(f"- {name}: plain {p.plain_decode_tok_s / pl.decode_tok_s:.2f}x llama.cpp's plain; "
                     f"n-gram {p.ngram_decode_tok_s / lk.decode_tok_s:.2f}x its lookup at k = 5, "
                     f"{p.ngram_auto_tok_s / lk.decode_tok_s:.2f}x with k auto "
                     f"(best {best / lk.decode_tok_s:.2f}x); TTFT "
                     f"{p.ttft_432_s * 1e3:.0f} ms against {pl.ttft_s * 1e3:.0f} ms")
    return lines
