"""Draft heads against the target on the conversations `train-draft` held out: how often each head's first draft
is the target's greedy choice, and how much of the target's distribution its own covers (what sampling accepts).

    .venv/bin/python scripts/head_agreement.py --data RUN/data default RUN_A RUN_B

--data is a `specdec train-draft --out RUN` folder's data (written with its soft labels); the held-out share is
the one `train-draft` drew (seed 0, 5% of the conversations), so the heads trained there never saw it. Per head,
over every answer position (including those whose target choice the draft vocabulary lacks):
- top-1: the head's first draft equals the target's greedy choice (greedy acceptance of the first draft);
- overlap at temperature T: sum over x of min(p(x), q(x)), the probability that the rejection sampler accepts the
  first draft when both are warped by T. p is the target's top SOFT_TOP tokens: at T = 1 the figure leaves p's
  tail out (a lower bound); at T = 0.7 p is those tokens warped and renormalized (an approximation).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.heads.bundled import head_dir
from specdec.heads.eagle import EagleHead
from specdec.models.loader import load_model
from specdec.train import data
from specdec.train.distill import TrainConfig, batch_of, draft_index, held_out, items_of


def agreement(head: EagleHead, items, embed: torch.Tensor, temperatures=(1.0, 0.7)) -> dict:
    tids, draft_of = head.target_ids(), draft_index(head)  # [draft_vocab], [target_vocab]
    top1, n, overlap = 0, 0, {t: 0.0 for t in temperatures}
    with torch.no_grad():
        for e, f, y, soft in items:
            emb, feats, _, _ = batch_of(e, f, y, None, embed, head, 1)
            rows = torch.arange(e.prompt_len - 1, len(e.tokens))  # [r]: every answer position
            logits = head.unrolled(emb, feats, 1, rows)[0]  # [r, draft_vocab]
            ids, logp = soft[0][rows].long(), soft[1][rows].float()  # [r, top]: the target's likeliest tokens
            d = draft_of[ids]  # [r, top]: their draft ids, -100 outside the draft vocabulary
            for t in temperatures:
                q = (logits / t).softmax(-1).gather(1, d.clamp(min=0)) * (d >= 0)  # [r, top]
                p = logp.exp() if t == 1.0 else (logp / t).softmax(-1)  # [r, top]
                overlap[t] += float(torch.minimum(p, q).sum())
            top1 += int((tids[logits.argmax(-1)] == y[rows]).sum())
            n += len(rows)
    return {"positions": n, "top1": top1 / n, **{f"overlap_t{t:g}": v / n for t, v in overlap.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a train-draft run's data folder (RUN/data)")
    ap.add_argument("heads", nargs="+", metavar="DIR|default", help="heads to compare ('default': the bundled one)")
    args = ap.parse_args()
    examples, feats, _ = data.load(Path(args.data))
    if feats.soft is None:
        raise SpecdecError(f"{args.data}: written without soft labels; write it again with this specdec")
    cfg = TrainConfig()  # train-draft's held-out share and seed
    val, _ = held_out(items_of(examples, feats, soft=True), cfg.validation, random.Random(cfg.seed))
    embed = load_model("default").model.embed
    for spec in args.heads:
        head = EagleHead.load(head_dir(None if spec == "default" else spec, "default")).float()
        r = agreement(head, val, embed)
        print(f"{spec}: top-1 {r['top1']:.4f}, overlap at T=1 {r['overlap_t1']:.4f} (lower bound), at T=0.7 "
              f"{r['overlap_t0.7']:.4f}, over {r['positions']} held-out answer positions")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecdecError as e:
        print(f"head_agreement: {e}", file=sys.stderr)
        sys.exit(2)
