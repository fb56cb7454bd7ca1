"""The quality price of each quantized KV cache type (q8_0, q4_0) against f16, measured as llama.cpp's
`llama-perplexity --kl-divergence` measures a quantization: the same model, the same text, only the cache differs.

    .venv/bin/python scripts/kv_quality.py [--model default] [--model PATH.gguf] [--contexts 1024,3072]
                                           [--windows summarization,rag,code] [--precision P] [--json FILE]

Per (model, context length, window) one f16 cache and one cache of each type are filled side by side with the
window's first `ctx` tokens (a chunked prefill, 256 tokens a pass, positions 0..ctx-1). As llama.cpp scores the
second half of each chunk, the logits at positions ctx/2 .. ctx-2 are scored (each has at least ctx/2 tokens of
context, and a next token in the window): KL(p_f16 || p_type) in float64 from log-softmax of both logits, whether
the argmax is the same, and the next token's log-probability (for the perplexities). Statistics are kept per chunk,
so no [ctx, vocab] logits are held (Gemma 3's vocabulary is 262k). Then each cache greedy-decodes 64 tokens from
its own prefill, one token a pass, and the type's tokens are compared with f16's.

Windows (each long enough for 3072 tokens with either tokenizer, encoded as raw text with the tokenizer's bos):
  summarization  the Spec-Bench summarization prompts (news articles, "Summarize: ..."), in file order, joined by
                 blank lines
  rag            the Spec-Bench rag prompts (retrieved passages and a question), likewise
  code           this project's specdec/drafters/*.py as committed at HEAD, sorted by name, each after a
                 "# file: PATH" line

The precision is the one specdec chooses at load unless --precision says otherwise. On gguf-q8 (activations
rounded to 8 bits before each weight product) any change upstream re-rolls those roundings, so its KL has a floor
that has nothing to do with the cache; gguf-q16 shows the cache's own price (docs/results/kv-cache-quality.md).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.kernels import source_digest  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402
from specdec.models.text.tokenizer import encode_text  # noqa: E402
from specdec.provenance import cpu_name  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
CHUNK = 256  # tokens a prefill pass
GREEDY = 64  # tokens greedy-decoded after the prompt
ROWS = 32  # logits rows a float64 block (Gemma 3: 32 x 262k x 8 bytes = 67 MB)


def window_text(name: str) -> str:
    """The text of window `name` (see the module docstring)."""
    if name in ("summarization", "rag"):
        rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
        return "\n\n".join(r["turns"][0] for r in rows if r["category"] == name)
    if name == "code":
        git = ["git", "-C", str(ROOT)]
        files = sorted(subprocess.run([*git, "ls-tree", "--name-only", "HEAD", "specdec/drafters/"], check=True,
                                      capture_output=True, text=True).stdout.split())
        return "\n\n".join(f"# file: {f}\n" + subprocess.run([*git, "show", f"HEAD:{f}"], check=True,
                                                              capture_output=True, text=True).stdout
                           for f in files if f.endswith(".py"))
    raise SystemExit(f"unknown window {name!r}")


@dataclass
class Scores:
    """One type against f16, accumulated over windows."""

    kl: list[torch.Tensor] = field(default_factory=list)  # [positions] float64 per chunk
    same_top: int = 0
    nll_ref: float = 0.0  # -sum log p_f16(next token)
    nll: float = 0.0  # -sum log p_type(next token)
    lead: list[int] = field(default_factory=list)  # leading greedy tokens equal to f16's, per window
    same_greedy: int = 0  # greedy positions equal to f16's, over windows
    seconds: float = 0.0  # this type's passes (prefill and greedy)


def score(ref: torch.Tensor, got: torch.Tensor, nxt: torch.Tensor, s: Scores) -> None:
    """Add rows of logits ref, got [n, vocab] (f16 cache, type's cache) with next tokens nxt [n] to s."""
    for a in range(0, ref.shape[0], ROWS):
        lp = torch.log_softmax(ref[a:a + ROWS].double(), -1)  # [<= ROWS, vocab]
        lq = torch.log_softmax(got[a:a + ROWS].double(), -1)
        s.kl.append((lp.exp() * (lp - lq)).sum(-1).clamp_min(0))  # rounding can give -1e-17
        t = nxt[a:a + ROWS, None]
        s.nll_ref -= float(lp.gather(1, t).sum())
        s.nll -= float(lq.gather(1, t).sum())
    s.same_top += int((ref.argmax(-1) == got.argmax(-1)).sum())


def greedy(model, cache, last: torch.Tensor, pos: int) -> list[int]:
    """GREEDY tokens from the logits `last` [vocab] of position pos - 1, one token a pass."""
    out = [int(last.argmax())]
    for i in range(GREEDY - 1):
        out.append(int(model.forward(torch.tensor([[out[-1]]]), torch.tensor([pos + i]), cache)[0, -1].argmax()))
    return out


def run_window(model, ids: list[int], types: list[str], scores: dict[str, Scores]) -> float:
    """Fill an f16 cache and one of each type with ids, score the second half, greedy-decode; f16's seconds."""
    ctx = len(ids)
    caches = {}
    for t in ["f16", *types]:
        model.use_kv_cache(t)
        caches[t] = model.new_cache(1, ctx + GREEDY)
    model.use_kv_cache("f16")
    x = torch.tensor(ids)
    first, seconds = ctx // 2, dict.fromkeys(caches, 0.0)
    last = {}
    for a in range(0, ctx, CHUNK):
        logits = {}
        for t, c in caches.items():
            t0 = time.perf_counter()
            logits[t] = model.forward(x[None, a:a + CHUNK], torch.tensor([a]), c)[0]  # [<= CHUNK, vocab]
            seconds[t] += time.perf_counter() - t0
            last[t] = logits[t][-1]
        lo, hi = max(first, a), min(a + CHUNK, ctx - 1)  # scored positions [lo, hi) of this chunk
        if lo < hi:
            for t in types:
                score(logits["f16"][lo - a:hi - a], logits[t][lo - a:hi - a], x[lo + 1:hi + 1], scores[t])
        del logits
    decoded = {}
    for t, c in caches.items():
        t0 = time.perf_counter()
        decoded[t] = greedy(model, c, last[t], ctx)
        seconds[t] += time.perf_counter() - t0
    for t in types:
        same = [u == v for u, v in zip(decoded["f16"], decoded[t])]
        scores[t].lead.append(same.index(False) if False in same else GREEDY)
        scores[t].same_greedy += sum(same)
        scores[t].seconds += seconds[t]
    return seconds["f16"]


def summary(s: Scores, windows: int) -> dict:
    """One row of the report: KL statistics over every scored position, perplexities, greedy agreement."""
    kl = torch.cat(s.kl)  # [positions]
    n = kl.numel()
    p = s.same_top / n
    return {"positions": n, "mean_kl": float(kl.mean()), "mean_kl_se": float(kl.std() / math.sqrt(n)),
            "p99_kl": float(torch.quantile(kl, 0.99)), "max_kl": float(kl.max()),
            "same_top1": p, "same_top1_se": math.sqrt(p * (1 - p) / n),
            "ppl_f16": math.exp(s.nll_ref / n), "ppl": math.exp(s.nll / n),
            "greedy_lead": s.lead, "greedy_same": s.same_greedy / (GREEDY * windows), "seconds": s.seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="'default' (bundled SmolLM2) or a .gguf; repeatable")
    ap.add_argument("--contexts", default="1024,3072")
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--windows", default="summarization,rag,code")
    ap.add_argument("--precision", help="the model's precision (default: chosen at load, as specdec chooses it)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    git = ["git", "-C", str(ROOT)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True).stdout.strip():
        rev += " + working tree"  # tracked files changed: the revision alone does not say what ran
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name(),
              "cores": torch.get_num_threads(), "revision": rev, "kernels": source_digest(),
              "command": " ".join(sys.argv),
              "scored": "logits at positions ctx/2 .. ctx-2 of each window", "greedy_tokens": GREEDY, "rows": []}
    types, names = args.types.split(","), args.windows.split(",")
    texts = {w: window_text(w) for w in names}
    print(f"{report['date']}, {report['cpu']}, revision {rev}, kernels' sources {report['kernels']}")
    rows = []
    for spec in args.model or ["default"]:
        lm = load_model(spec, args.precision)
        model, tok = lm.model, lm.tokenizer
        label = Path(spec).stem if spec != "default" else "SmolLM2-135M-Instruct (bundled)"
        ids = {w: encode_text(tok, texts[w]) for w in names}
        for ctx in map(int, args.contexts.split(",")):
            short = [w for w in names if len(ids[w]) < ctx]
            if short:
                raise SystemExit(f"windows {short} have fewer than {ctx} tokens")
            scores = {t: Scores() for t in types}
            t0 = time.perf_counter()
            f16_s = sum(run_window(model, ids[w][:ctx], types, scores) for w in names)
            total = time.perf_counter() - t0
            for t in types:
                row = {"model": label, "precision": model.precision, "ctx": ctx, "type": t, "windows": names,
                       **summary(scores[t], len(names)), "f16_seconds": f16_s, "total_seconds": total}
                rows.append(row)
                print(f"{label} {ctx} {t}: mean KL {row['mean_kl']:.5f}, same top-1 {row['same_top1']:.4f}, "
                      f"{row['seconds']:.1f} s", flush=True)
    report["rows"] = rows
    print(f"\nwindows: {', '.join(names)}; scored: {report['scored']}; greedy: {GREEDY} tokens\n")
    print("| model | ctx | KV | positions | mean KL ± se | p99 KL | same top-1 | PPL f16 -> type | greedy lead "
          "(per window) | greedy same | s (type's passes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} ({r['precision']}) | {r['ctx']} | {r['type']} | {r['positions']} | "
              f"{r['mean_kl']:.5f} ± {r['mean_kl_se']:.5f} | {r['p99_kl']:.4f} | {r['same_top1']:.4f} | "
              f"{r['ppl_f16']:.3f} -> {r['ppl']:.3f} | {', '.join(map(str, r['greedy_lead']))} | "
              f"{r['greedy_same']:.3f} | {r['seconds']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
