"""How much each precision path changes the bundled model, against fp32: top-1 agreement of next-token
predictions and perplexity, teacher-forced over Spec-Bench prompts.

    .venv/bin/python scripts/quality.py [--prompts ../shared/data/spec_bench/question.jsonl] [--n 24]

fp16 is measured on both of its paths: prefill (fbgemm) and decode (the native kernel, fed 8 tokens per
pass, as verification feeds it).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from specdec.models.loader import load_model

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
    args = ap.parse_args()
    ref = load_model("default", "fp32")
    tok = ref.tokenizer
    texts = prompts(args.prompts, args.n)
    seqs = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]))[: args.max_tokens] for t in texts]
    paths = {"fp32": (ref.model, None)}
    for prec in ("fp16", "int8"):
        m = load_model("default", prec).model
        paths[f"{prec} (prefill path)"] = (m, None)
        if prec == "fp16" and m.kernels is not None:
            paths["fp16 (decode path, native kernel)"] = (m, 8)
        elif prec == "int8":
            paths["int8 (decode path)"] = (m, 8)
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
