"""`specdec bench long-context`: long contexts on the bundled model, measured in one run so that every ratio
shares one machine state (`--quick`: contexts 512 and 3072, fewer repetitions).

1. This machine: read bandwidth (a sum over 1 GiB), the fp32 multiply-add peak of the native kernels' FMA and the rate
   of the int8 dot products the matrix products issue on the gguf-q16 default, each at the widest vector the kernels
   run here, as `profile` measures them.
2. Per context (512, 2k, 3k, 4k, 8k): the one-row decode pass against its memory floor (weight bytes plus the KV
   bytes of the context, at the measured bandwidth), and the verify cost curve T(n)/T(1) for 1 to 9 rows.
3. Time to first token of `Engine.generate` at 3k and 8k prompt tokens against the compute floor (the pass's
   multiply-adds at the measured peak; attention's at the rate its cache type allows, as `specdec profile
   --prompt-tokens` prices it: fp32 FMAs on f16, int8 dot products on q8_0 and q4_0).
4. n-gram speculation on long copy-heavy prompts (Spec-Bench summarization and rag items of --prompts, a long file
   edit), greedy: decode-phase speed with and without it, k = 5 and the `auto` policy, and whether outputs are
   identical.
5. Prefix caching: a second question about the same document, time to first token against the first's.
6. llama.cpp on the same GGUF and the long summarization prompt (when node-llama-cpp is installed: the worker of
   specdec.bench.engines.llamacpp_compare): time to first token and plain decoding.

Goals (issue 13): at 3k >= 80% of the speed at 512; 6 rows <= 1.3 one-row passes at 3k; n-gram >= 1.5x in the
decode phase at 3k with identical output; TTFT within 1.5x of the compute floor and >= 2x faster than llama.cpp;
the second question's TTFT <= 10% of the first's. Writes OUT/long-context.json (with the machine's provenance) and
.md (specdec.bench.hardware.long_context_report); prints the report.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from specdec.bench.engines.llamacpp_compare import plain_and_lookup
from specdec.bench.hardware.long_context_report import ROWS, ContextPass, LongContextRun, NgramRow, PrefixRun, TtftPoint
from specdec.bench.hardware.profile import attention_rate, compute_floor, measure_bandwidth
from specdec.bench.prompts import load_prompts, select
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.policy import Auto, PassCost
from specdec.models.text.tokenizer import encode_prompt
from specdec.models.timing import time_passes
from specdec.theory.floor import Rates, prompt_floor


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def pass_floor(model, rates: Rates, position: int) -> float:
    """Seconds of arithmetic in one token-row's pass at `position`: the matrix products (LM head included) at the
    rate the model's kernels issue them, attention over position + 1 keys at the rate its cache type allows (the fp32
    FMA rate on f16, the int8 one on q8_0 and q4_0: profile.attention_rate)."""
    cfg = model.cfg
    att = cfg.num_layers * cfg.num_heads * cfg.head_dim * 2 * (position + 1)
    return model.macs_per_token / rates.product_rate + att / rates.attention


def prefill_floor(model, rates: Rates, n: int) -> float:
    """The same for a prompt of n tokens (theory/floor.py prompt_floor, as `specdec profile --prompt-tokens`
    prices it): every position's products and attention, the LM head once."""
    cfg = model.cfg
    att = cfg.num_layers * cfg.num_heads * cfg.head_dim * 2 * n * (n + 1) / 2
    return prompt_floor(n, model.macs_per_token, cfg.vocab_size * cfg.hidden_size, att, rates).seconds


def file_edit_prompt(tokenizer, target: int) -> str:
    """A copy-heavy user message of about `target` tokens once the chat template is applied: rename a class in
    a source file of this package, and output the whole file."""
    lines = (Path(__file__).resolve().parents[2] / "engine" / "scheduler.py").read_text().splitlines()
    head = "Rename the class `Scheduler` to `StepLoop` in this Python module and output the whole module:\n\n"
    while len(encode_prompt(tokenizer, head + "\n".join(lines), chat=True)) > target:
        lines = lines[:-10]
    return head + "\n".join(lines)


def long_prompts(tokenizer, target: int, spec_bench: str) -> dict[str, str]:
    """Copy-heavy user messages of about `target` tokens once the chat template is applied."""
    bench = load_prompts(spec_bench)

    def size(text: str) -> int:
        return len(encode_prompt(tokenizer, text, chat=True))

    def stack(category: str, question: str) -> str:
        text = ""
        for p in select(bench, [category]):
            if size(text + p.turns[0] + "\n\n" + question) > target:
                break
            text += p.turns[0] + "\n\n"
        return text + question

    return {
        "summarization": stack("summarization", "Summarize the last article above in a few sentences."),
        "rag": stack("rag", "Answer the last question above from the documents given."),
        "file edit": file_edit_prompt(tokenizer, target),
    }


def decode_rate(result) -> float:
    """Tokens per second after the first token (the decode phase)."""
    s = result.stats
    return (s.generated_tokens - 1) / max(s.total_s - s.ttft_s, 1e-9)


def measure_ngram(model, tokenizer, prompts: dict[str, str], new_tokens: int, cost: PassCost) -> list[NgramRow]:
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
        rows.append(NgramRow(
            prompt=name, prompt_tokens=len(ids), new_tokens=len(plain.token_ids), plain_tok_s=base,
            ttft_s=plain.stats.ttft_s, k5_tok_s=decode_rate(fixed), k5_speedup=decode_rate(fixed) / base,
            k5_tokens_per_pass=(fixed.stats.generated_tokens - 1) / max(1, len(fixed.stats.rounds)),
            auto_tok_s=decode_rate(auto), auto_speedup=decode_rate(auto) / base,
            identical=plain.token_ids == fixed.token_ids == auto.token_ids))
    return rows


def measure_prefix(model, tokenizer, document: str) -> PrefixRun:
    """Two questions about one document, one after the other, through one Engine with a prefix cache."""
    engine = Engine(model, tokenizer, prefix_cache=1)
    asks = [encode_prompt(tokenizer, document + "\n\n" + q, chat=True)
            for q in ("Who is this article about?", "List three facts from it.")]
    first = engine.generate([asks[0]], GenerationConfig(1), None, 1)[0]
    second = engine.generate([asks[1]], GenerationConfig(1), None, 1)[0]
    return PrefixRun(prompt_tokens=[len(a) for a in asks], cached_tokens=second.stats.cached_tokens,
                     first_ttft_s=first.stats.ttft_s, second_ttft_s=second.stats.ttft_s,
                     ratio=second.stats.ttft_s / first.stats.ttft_s)


def run_long_context(args) -> int:
    """args: prompts (Spec-Bench question.jsonl), out (a folder), max_new_tokens, quick, kv_cache (the bundled
    model's KV cache type; None: f16)."""
    from specdec.atomic import write_text_atomic
    from specdec.bench.hardware.long_context_report import render
    from specdec.models.gguf.convert import bundled_gguf_path
    from specdec.models.target import TargetTraits
    from specdec.provenance import provenance
    from specdec.runtime import ModelSpec, build

    contexts = [512, 3072] if args.quick else [512, 2048, 3072, 4096, 8180]  # 8180 + 9 rows fit 8192
    reps = 3 if args.quick else 5

    loaded = build(ModelSpec(model="default", kv_cache=getattr(args, "kv_cache", None)))[0]
    model, tok = loaded.model, loaded.tokenizer
    if model.kernels is None:
        log("the native kernels are not available: these figures would describe the torch fallback")
    log("bandwidth and multiply-add peak")
    bw = measure_bandwidth(1 << 30, 7)["read_GBps"] * 1e9
    peak = model.kernels.fma_peak(0.5) if model.kernels is not None else float("nan")
    products = compute_floor(model, 0.0)  # the peak rate of the products' arithmetic (int8 on gguf-q16)
    att_rate = attention_rate(model)[0] if model.kernels is not None else None
    rates = Rates(bw, products["macs_per_s"] if products else peak, peak, att_rate)
    weights, kv = model.weight_bytes_per_token, model.kv_bytes_per_token()

    passes = []
    for ctx in contexts:
        log(f"passes at context {ctx}")
        t = time_passes(model, ctx, ROWS, reps)
        med = {n: statistics.median(v) for n, v in t.items()}
        passes.append(ContextPass(context=ctx, step_s=med[1], floor_s=(weights + kv * ctx) / bw,
                                  compute_floor_s=pass_floor(model, rates, ctx),
                                  verify_cost={str(n): med[n] / med[1] for n in ROWS}))
    at3k = next(p for p in passes if p.context == 3072)
    cost = PassCost(tuple((n, at3k.verify_cost[str(n)] * at3k.step_s) for n in ROWS))  # the auto policy's input

    ttft = []
    for n in ([3072] if args.quick else [3072, 8180]):
        log(f"time to first token at {n}")
        ids = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        r = Engine(model, tok).generate([ids], GenerationConfig(1), None, 1)[0]
        ttft.append(TtftPoint(prompt_tokens=n, ttft_s=r.stats.ttft_s, compute_floor_s=prefill_floor(model, rates, n)))

    prompts = long_prompts(tok, 3100, args.prompts)
    ngram = measure_ngram(model, tok, prompts, args.max_new_tokens, cost)
    log("prefix cache")
    prefix = measure_prefix(model, tok, prompts["summarization"])
    log("llama.cpp")
    llama = plain_and_lookup(bundled_gguf_path(), prompts["summarization"], args.max_new_tokens,
                             torch.get_num_threads(), log)

    machine = provenance()
    machine["bandwidth_gbs"] = round(bw / 1e9, 2)
    result = LongContextRun(bandwidth_gb_s=bw / 1e9, fma_peak_gmac_s=peak / 1e9, weight_bytes=weights,
                            kv_bytes_per_position=kv, passes=passes, ttft=ttft, ngram=ngram, prefix=prefix,
                            llamacpp=llama, threads=torch.get_num_threads(), products_gmac_s=rates.product_rate / 1e9,
                            products_arithmetic=products["arithmetic"] if products else "torch", machine=machine,
                            kv_cache=TargetTraits.of(model).kv_cache)
    report = render(result)
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "long-context.json")
    write_text_atomic(out / "long-context.md", report)
    return 0
