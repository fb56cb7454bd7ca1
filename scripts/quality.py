"""How much each precision path changes a model (the bundled one unless --model), against fp32: top-1 agreement
of next-token predictions and perplexity, teacher-forced over Spec-Bench prompts.

    .venv/bin/python scripts/quality.py [--prompts ../shared/data/spec_bench/question.jsonl] [--n 24] [--model M]

Each path runs as decoding runs it: the native kernels fed 8 tokens a pass (as verification feeds them), the
torch path (int8; every Gemma 3 path, gguf-q16 included) in one pass. fp32 is the GGUF's weights dequantized
exactly, so `gguf` (the same weights, in fp32 arithmetic on the file's blocks) differs from it only in the order of
its sums.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from specdec.models.loader import load_model
from specdec.models.text.tokenizer import encode_prompt

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def prompts(path: Path, n: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[str]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r["turns"][0])
    cats = sorted(by_cat)
    out = []
    while len(out) < n:  # round-robin over categories
        for c in cats:
            if by_cat[c] and len(out) < n:
                out.append(by_cat[c].pop(0))
    return out


def logits_for(model, ids: list[int], decode_chunk: int | None) -> torch.Tensor:
    """[len(ids), vocab] next-token logits, by one prefill pass or by decode passes of `decode_chunk` tokens."""
    cache = model.new_cache(1, len(ids) + 16)
    t = torch.tensor([ids])
    if decode_chunk is None:
        return model.forward(t, torch.tensor([0]), cache, prefill=True)[0]
    first = model.forward(t[:, :1], torch.tensor([0]), cache, prefill=True)[0]
    parts = [first]
    for s in range(1, len(ids), decode_chunk):
        parts.append(model.forward(t[:, s:s + decode_chunk], torch.tensor([s]), cache)[0])
    return torch.cat(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--paths", default="fp16,int8,gguf,gguf-q16,gguf-q8", help="precisions to compare with fp32")
    ap.add_argument("--model", default="default", help="'default' (bundled SmolLM2), a folder or a .gguf")
    args = ap.parse_args()
    ref = load_model(args.model, "fp32")
    tok = ref.tokenizer
    texts = prompts(args.prompts, args.n)
    seqs = [encode_prompt(tok, t, chat=True)[: args.max_tokens] for t in texts]  # raw text (+ <bos>) without a template
    paths = {"fp32": (ref.model, None)}
    for prec in args.paths.split(","):
        m = load_model(args.model, prec).model
        if m.kernels is None:
            paths[f"{prec} (torch path)"] = (m, None)
            continue
        # with the native kernels a prefill runs the decode kernel too; 8 tokens a pass, as verification feeds it
        paths[f"{prec} (native kernel, 8 rows a pass)"] = (m, 8)
        if prec == "fp16":
            paths["fp16 (one prefill pass)"] = (m, None)
    ref_top, ref_logits = [], []
    for ids in seqs:
        lg = logits_for(ref.model, ids, None)
        ref_logits.append(lg)
        ref_top.append(lg.argmax(-1))
    print(f"{len(seqs)} Spec-Bench prompts, {sum(len(s) for s in seqs)} positions, up to {args.max_tokens} tokens each")
    print("| path | top-1 agreement with fp32 | perplexity |\n|---|---|---|")
    for name, (model, chunk) in paths.items():
        agree = total = 0
        nll = 0.0
        for ids, top, ref_lg in zip(seqs, ref_top, ref_logits):
            lg = ref_lg if name == "fp32" else logits_for(model, ids, chunk)
            agree += int((lg.argmax(-1) == top).sum())
            total += len(ids)
            logp = torch.log_softmax(lg[:-1].float(), -1)
            nll -= float(logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum())
        ppl = math.exp(nll / (total - len(seqs)))
        print(f"| {name} | {agree / total:.4f} | {ppl:.2f} |")


if __name__ == "__main__":
    main()
