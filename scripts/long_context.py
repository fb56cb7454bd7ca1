"""Long contexts on the bundled model, measured in one run so that every ratio shares one machine state.

    .venv/bin/python scripts/long_context.py            # the full run: about 10 minutes
    .venv/bin/python scripts/long_context.py --quick    # a smoke test: contexts 512 and 3072, fewer repetitions

1. This machine: read bandwidth (a sum over 1 GiB), the fp32 multiply-add peak of the native kernels' FMA and the rate
   the matrix products are issued at (int8 blocks on the gguf-q16 default, as `profile` measures it).
2. Per context (512, 2k, 3k, 4k, 8k): the one-row decode pass against its memory floor (weight bytes plus the KV
   bytes of the context, at the measured bandwidth), and the verify cost curve T(n)/T(1) for 1 to 9 rows.
3. Time to first token of `Engine.generate` at 3k and 8k prompt tokens against the compute floor (the pass's
   multiply-adds at the measured peak).
4. n-gram speculation on long copy-heavy prompts (Spec-Bench summarization and rag items, a long file edit),
   greedy: decode-phase speed with and without it, k = 5 and the `auto` policy, and whether outputs are identical.
5. Prefix caching: a second question about the same document, time to first token against the first's.
6. llama.cpp on the same GGUF and the long summarization prompt (when node-llama-cpp is installed: see
   scripts/llamacpp_run.mjs): time to first token and plain decoding.

Goals (issue 13): at 3k >= 80% of the speed at 512; 6 rows <= 1.3 one-row passes at 3k; n-gram >= 1.5x in the
decode phase at 3k with identical output; TTFT within 1.5x of the compute floor and >= 2x faster than llama.cpp;
the second question's TTFT <= 10% of the first's. Writes OUT/long-context.json and .md; prints the report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.atomic import write_text_atomic  # noqa: E402
from specdec.bench.profile import compute_floor, measure_bandwidth, time_passes  # noqa: E402
from specdec.bench.prompts import load_prompts, select  # noqa: E402
from specdec.drafters.ngram import NgramDrafter  # noqa: E402
from specdec.engine.generate import Engine, GenerationConfig  # noqa: E402
from specdec.engine.policy import Auto, PassCost  # noqa: E402
from specdec.models.gguf_convert import bundled_gguf_path  # noqa: E402
from specdec.runtime import ModelSpec, build, encode_prompt  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
ROWS = list(range(1, 10))


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def pass_floor(model, rates: tuple[float, float], position: int) -> float:
    """Seconds of arithmetic in one token-row's pass at `position`: the matrix products (LM head included) at the
    rate the model's kernels issue them, attention over position + 1 keys at the fp32 FMA rate. rates: (products,
    fp32 FMA) multiply-adds per second."""
    cfg = model.cfg
    att = cfg.num_layers * cfg.num_heads * cfg.head_dim * 2 * (position + 1)
    return model.macs_per_token / rates[0] + att / rates[1]


def prefill_floor(model, rates: tuple[float, float], n: int) -> float:
    """The same for a prompt of n tokens: every position's products and attention, the LM head once."""
    cfg = model.cfg
    head = cfg.vocab_size * cfg.hidden_size
    att = cfg.num_layers * cfg.num_heads * cfg.head_dim * 2 * n * (n + 1) / 2
    return (n * (model.macs_per_token - head) + head) / rates[0] + att / rates[1]


def long_prompts(tokenizer, target: int) -> dict[str, str]:
    """Copy-heavy user messages of about `target` tokens once the chat template is applied."""
    bench = load_prompts(SPEC_BENCH)

    def size(text: str) -> int:
        return len(encode_prompt(tokenizer, text, chat=True))

    def stack(category: str, question: str) -> str:
        text = ""
        for p in select(bench, [category]):
            if size(text + p.turns[0] + "\n\n" + question) > target:
                break
            text += p.turns[0] + "\n\n"
        return text + question

    lines = (ROOT / "specdec" / "engine" / "scheduler.py").read_text().splitlines()
    head = "Rename the class `Scheduler` to `StepLoop` in this Python module and output the whole module:\n\n"
    while size(head + "\n".join(lines)) > target:
        lines = lines[:-10]
    return {
        "summarization": stack("summarization", "Summarize the last article above in a few sentences."),
        "rag": stack("rag", "Answer the last question above from the documents given."),
        "file edit": head + "\n".join(lines),
    }


def decode_rate(result) -> float:
    """Tokens per second after the first token (the decode phase)."""
    s = result.stats
    return (s.generated_tokens - 1) / max(s.total_s - s.ttft_s, 1e-9)


def measure_ngram(model, tokenizer, prompts: dict[str, str], new_tokens: int, cost: PassCost) -> list[dict]:
    rows = []
    cfg = GenerationConfig(new_tokens)
    for name, text in prompts.items():
        ids = encode_prompt(tokenizer, text, chat=True)
        log(f"n-gram: {name} ({len(ids)} tokens)")
        engine = Engine(model, tokenizer)
        plain = engine.generate([ids], cfg, None, 1)[0]
        fixed = engine.generate([ids], cfg, NgramDrafter(4, 1), 5)[0]
        auto = engine.generate([ids], cfg, NgramDrafter(4, 1), Auto(cost, max_k=8))[0]
        base = decode_rate(plain)
        rows.append({
            "prompt": name, "prompt_tokens": len(ids), "new_tokens": len(plain.token_ids),
            "plain_tok_s": base, "ttft_s": plain.stats.ttft_s,
            "k5_tok_s": decode_rate(fixed), "k5_speedup": decode_rate(fixed) / base,
            "k5_tokens_per_pass": (fixed.stats.generated_tokens - 1) / max(1, len(fixed.stats.rounds)),
            "auto_tok_s": decode_rate(auto), "auto_speedup": decode_rate(auto) / base,
            "identical": plain.token_ids == fixed.token_ids == auto.token_ids,
        })
    return rows


def measure_prefix(model, tokenizer, document: str) -> dict:
    """Two questions about one document, one after the other, through one Engine with a prefix cache."""
    engine = Engine(model, tokenizer, prefix_cache=1)
    asks = [encode_prompt(tokenizer, document + "\n\n" + q, chat=True)
            for q in ("Who is this article about?", "List three facts from it.")]
    first = engine.generate([asks[0]], GenerationConfig(1), None, 1)[0]
    second = engine.generate([asks[1]], GenerationConfig(1), None, 1)[0]
    return {"prompt_tokens": [len(a) for a in asks], "cached_tokens": second.stats.cached_tokens,
            "first_ttft_s": first.stats.ttft_s, "second_ttft_s": second.stats.ttft_s,
            "ratio": second.stats.ttft_s / first.stats.ttft_s}


def measure_llamacpp(gguf: Path, text: str, new_tokens: int) -> dict | None:
    """llama.cpp through scripts/llamacpp_run.mjs on the same user message (its chat template is the GGUF's,
    the same as ours): plain decoding, then its prompt lookup. None when node-llama-cpp is not installed."""
    script = ROOT / "scripts" / "llamacpp_run.mjs"
    home = Path(os.environ.get("NODE_LLAMA_DIR", "/tmp/llamacpp"))
    if not (shutil.which("node") and (home / "node_modules" / "node-llama-cpp").is_dir()):
        log("llama.cpp: node-llama-cpp not installed (see scripts/llamacpp_run.mjs): skipped")
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    runs = {}
    try:
        for name, extra in (("plain", []), ("lookup", ["--lookup"])):
            out = subprocess.run(["node", str(script), "--model", str(gguf), "--prompt-file", f.name, "--chat",
                                  "--max-tokens", str(new_tokens), "--threads", str(torch.get_num_threads()),
                                  *extra], capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                log(f"llama.cpp failed: {out.stderr[-400:]}")
                return None
            runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    contexts = [512, 3072] if args.quick else [512, 2048, 3072, 4096, 8180]  # 8180 + 9 rows fit 8192
    reps = 3 if args.quick else 5

    loaded = build(ModelSpec(model="default"))[0]
    model, tok = loaded.model, loaded.tokenizer
    if model.kernels is None:
        log("the native kernels are not available: these figures would describe the torch fallback")
    log("bandwidth and multiply-add peak")
    bw = measure_bandwidth(1 << 30, 7)["read_GBps"] * 1e9
    peak = model.kernels.fma_peak(0.5) if model.kernels is not None else float("nan")
    products = compute_floor(model, 0.0)  # the rate the matrix products are issued at (int8 blocks on gguf-q16)
    rates = (products["macs_per_s"] if products else peak, peak)
    weights, kv = model.weight_bytes_per_token, model.kv_bytes_per_token()

    passes = []
    for ctx in contexts:
        log(f"passes at context {ctx}")
        t = time_passes(model, ctx, ROWS, reps)
        med = {n: statistics.median(v) for n, v in t.items()}
        passes.append({"context": ctx, "step_s": med[1], "floor_s": (weights + kv * ctx) / bw,
                       "compute_floor_s": pass_floor(model, rates, ctx),
                       "verify_cost": {str(n): med[n] / med[1] for n in ROWS}})
    at3k = next(p for p in passes if p["context"] == 3072)
    cost = PassCost(tuple((n, at3k["verify_cost"][str(n)] * at3k["step_s"]) for n in ROWS))  # the auto policy's input

    ttft = []
    for n in ([3072] if args.quick else [3072, 8180]):
        log(f"time to first token at {n}")
        ids = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        r = Engine(model, tok).generate([ids], GenerationConfig(1), None, 1)[0]
        ttft.append({"prompt_tokens": n, "ttft_s": r.stats.ttft_s, "compute_floor_s": prefill_floor(model, rates, n)})

    prompts = long_prompts(tok, 3100)
    ngram = measure_ngram(model, tok, prompts, args.new_tokens, cost)
    log("prefix cache")
    prefix = measure_prefix(model, tok, prompts["summarization"])
    log("llama.cpp")
    llama = measure_llamacpp(bundled_gguf_path(), prompts["summarization"], args.new_tokens)

    result = {"bandwidth_gb_s": bw / 1e9, "fma_peak_gmac_s": peak / 1e9, "products_gmac_s": rates[0] / 1e9,
              "products_arithmetic": products["arithmetic"] if products else "torch", "weight_bytes": weights,
              "kv_bytes_per_position": kv, "passes": passes, "ttft": ttft, "ngram": ngram, "prefix": prefix,
              "llamacpp": llama, "threads": torch.get_num_threads()}
    report = render(result)
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "long-context.json", json.dumps(result, indent=1))
    write_text_atomic(out / "long-context.md", report)
    return 0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(r: dict) -> str:
    at = {p["context"]: p for p in r["passes"]}
    lines = ["# Long contexts on the bundled model", "",
             "Measured by `scripts/long_context.py` (`make long-context`) in one run; greedy; 2 threads.", "",
             f"Machine: read bandwidth {r['bandwidth_gb_s']:.1f} GB/s, fp32 multiply-add peak "
             f"{r['fma_peak_gmac_s']:.0f} G/s, the matrix products' {r['products_gmac_s']:.0f} G/s "
             f"({r['products_arithmetic']}; {r['threads']} threads); weights {r['weight_bytes'] / 1e6:.0f} MB "
             f"a pass, KV cache {r['kv_bytes_per_position'] / 1e3:.1f} KB a position.", "",
             "| context | decode ms/token | tok/s | vs 512 | memory floor ms | of floor | compute floor ms | "
             + " | ".join(f"{n} rows" for n in ROWS[1:]) + " |",
             "|---" * (7 + len(ROWS) - 1) + "|"]
    for c, p in at.items():
        lines.append(f"| {c} | {p['step_s'] * 1e3:.1f} | {1 / p['step_s']:.1f} | "
                     f"{at[512]['step_s'] / p['step_s']:.2f} | {p['floor_s'] * 1e3:.1f} | "
                     f"{p['floor_s'] / p['step_s']:.0%} | {p['compute_floor_s'] * 1e3:.1f} | "
                     + " | ".join(f"{p['verify_cost'][str(n)]:.2f}" for n in ROWS[1:]) + " |")
    lines += ["", "| prompt tokens | time to first token | compute floor | ratio |", "|---|---|---|---|"]
    for t in r["ttft"]:
        lines.append(f"| {t['prompt_tokens']} | {t['ttft_s']:.2f} s | {t['compute_floor_s']:.2f} s | "
                     f"{t['ttft_s'] / t['compute_floor_s']:.2f} |")
    lines += ["", "| prompt | tokens | plain tok/s | n-gram k=5 tok/s | speedup | tokens/pass | auto tok/s | "
              "speedup | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for n in r["ngram"]:
        lines.append(f"| {n['prompt']} | {n['prompt_tokens']} | {n['plain_tok_s']:.1f} | {n['k5_tok_s']:.1f} | "
                     f"{n['k5_speedup']:.2f}x | {n['k5_tokens_per_pass']:.2f} | {n['auto_tok_s']:.1f} | "
                     f"{n['auto_speedup']:.2f}x | {n['identical']} |")
    p = r["prefix"]
    lines += ["", f"Prefix cache: first question {p['first_ttft_s']:.2f} s to first token, second question on the "
              f"same document {p['second_ttft_s']:.3f} s ({p['ratio']:.1%}; {p['cached_tokens']} of "
              f"{p['prompt_tokens'][1]} prompt tokens reused)."]
    ll = r["llamacpp"]
    if ll:
        ours = next(n for n in r["ngram"] if n["prompt"] == "summarization")
        pl, lk = ll["plain"], ll["lookup"]
        lines.append(f"llama.cpp, same GGUF and summarization prompt ({pl['prompt_tokens']} tokens, "
                     f"{ours['prompt_tokens']} ours): time to first token {pl['ttft_s']:.2f} s against ours "
                     f"{ours['ttft_s']:.2f} s ({pl['ttft_s'] / ours['ttft_s']:.2f}x); plain decoding "
                     f"{pl['decode_tok_s']:.1f} tok/s against ours {ours['plain_tok_s']:.1f}; its prompt lookup "
                     f"{lk['decode_tok_s']:.1f} tok/s "
                     f"({lk['decode_tok_s'] / pl['decode_tok_s']:.2f}x its plain), ours with n-gram "
                     f"{max(ours['k5_tok_s'], ours['auto_tok_s']):.1f}.")
    lines.append("")
    if 3072 in at:
        speed = at[512]["step_s"] / at[3072]["step_s"]
        lines.append(f"{verdict(speed >= 0.8)}: decoding at 3k runs at {speed:.0%} of its speed at 512 (goal >= 80%)")
        six = at[3072]["verify_cost"]["6"]
        lines.append(f"{verdict(six <= 1.3)}: a 6-row verify pass at 3k costs {six:.2f} one-row passes (goal <= 1.3)")
    for n in r["ngram"]:
        best = max(n["k5_speedup"], n["auto_speedup"])
        lines.append(f"{verdict(best >= 1.5 and n['identical'])}: n-gram speculation in the decode phase at 3k, "
                     f"{n['prompt']}: k=5 {n['k5_speedup']:.2f}x, auto {n['auto_speedup']:.2f}x (goal >= 1.5x), "
                     f"output identical to plain: {n['identical']}")
    for t in r["ttft"]:
        q = t["ttft_s"] / t["compute_floor_s"]
        lines.append(f"{verdict(q <= 1.5)}: time to first token at {t['prompt_tokens']} is {q:.2f}x the compute "
                     f"floor (goal <= 1.5x)")
    if ll:
        q = ll["plain"]["ttft_s"] / next(n for n in r["ngram"] if n["prompt"] == "summarization")["ttft_s"]
        lines.append(f"{verdict(q >= 2)}: time to first token {q:.2f}x faster than llama.cpp (goal >= 2x)")
    lines.append(f"{verdict(p['ratio'] <= 0.1)}: the second question reaches its first token in {p['ratio']:.1%} of "
                 f"the first's time (goal <= 10%)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
