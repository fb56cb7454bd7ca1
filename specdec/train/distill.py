"""Training an EAGLE-3 head by self-distillation: the target's greedy choices along answers to training prompts.

Each step takes one conversation and unrolls the head over `steps` drafting steps at every answer position
(training-time test: later steps read the head's own outputs, as drafting does). The loss at step j, weighted
0.8^j, is the cross-entropy against the target's greedy choice there (hard labels, the default) or against its
next-token distribution (soft labels: its SOFT_TOP likeliest tokens that the draft vocabulary holds,
renormalized). Checkpoints go to OUT/checkpoint.pt every `save_every` steps and when the time budget ends; a
second run with the same OUT resumes from it.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specdec.atomic import atomic_file
from specdec.errors import SpecdecError
from specdec.heads.eagle import EagleHead, HeadConfig
from specdec.train.data import Example, Features

STEP_WEIGHT = 0.8  # EAGLE-3's per-step loss decay


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3  # drafting steps unrolled per position (training-time test)
    epochs: float = 4.0
    lr: float = 1e-3
    warmup: int = 50  # optimizer steps of linear warmup, then cosine decay to 10%
    accumulate: int = 2  # conversations per optimizer step
    hours: float | None = None  # stop (and checkpoint) after this much training time
    save_every: int = 200  # optimizer steps between checkpoints
    validation: float = 0.05  # share of conversations held out to measure per-step accuracy (0: none)
    seed: int = 0
    labels: str = "hard"  # hard: the target's greedy choice; soft: its distribution (top SOFT_TOP)


def draft_vocabulary(examples: list[Example], feats: Features, size: int, vocab: int) -> torch.Tensor:
    """The `size` target ids the target chooses most often over the answers, ascending ([size] long)."""
    if not 1 <= size <= vocab:
        raise SpecdecError(f"--draft-vocab must be in 1..{vocab}, got {size}")
    counts = torch.zeros(vocab, dtype=torch.long)
    for e, y in zip(examples, feats.labels):
        counts += torch.bincount(y[e.prompt_len - 1:], minlength=vocab)
    return counts.topk(size).indices.sort().values


def coverage(examples: list[Example], feats: Features, t2d: torch.Tensor) -> float:
    """Share of answer positions whose target choice the draft vocabulary holds: the ceiling on acceptance."""
    hit = tot = 0
    for e, y in zip(examples, feats.labels):
        a = y[e.prompt_len - 1:]
        hit, tot = hit + int(t2d[a].sum()), tot + len(a)
    return hit / max(tot, 1)


def init_head(cfg: HeadConfig, target, draft_ids: torch.Tensor) -> EagleHead:
    """The head starts near the target's own reading of its highest tapped layer: fc passes that layer's features
    through, the layer's output projections start small (so the block starts near the identity), and the head is
    the target's over the draft vocabulary (its tied embedding rows), with the target's final norm scaled by 0.3:
    a layer 3 blocks from the end read through the final norm gives confidently wrong logits (measured on the
    bundled model over 20 conversations: weighted loss 40.1 with the norm as it is, 17.8 scaled by 0.3, near
    uniform guessing)."""
    head = EagleHead(cfg)
    head.set_vocab(draft_ids)
    h = cfg.hidden
    with torch.no_grad():
        head.lm_head.weight.copy_(target.embed[draft_ids])
        head.norm.copy_(target.norm * 0.3)
        head.fc.weight.zero_()
        head.fc.weight[:, -h:] = torch.eye(h)
        head.o_proj.weight.mul_(0.1)
        head.down_proj.weight.mul_(0.1)
    return head


def draft_index(head: EagleHead) -> torch.Tensor:
    """[target_vocab] long: each target id's draft id, -100 where the draft vocabulary lacks it."""
    index = torch.full((head.cfg.target_vocab,), -100, dtype=torch.long)
    index[head.target_ids()] = torch.arange(head.cfg.draft_vocab)
    return index


def batch_of(e: Example, f: torch.Tensor, y: torch.Tensor, soft, embed: torch.Tensor, head: EagleHead, steps: int):
    """One conversation as tensors: emb [n, steps, hidden], feats [n, taps*hidden], targets [steps, n] (draft ids,
    -100 where masked), and with soft = (ids, logp) [n, top] the target's distributions as (draft ids [steps, n,
    top], probabilities [steps, n, top]: 0 outside the draft vocabulary, the rest renormalized), else None."""
    toks = torch.tensor(e.tokens)  # [n]
    n = len(toks)
    idx = torch.arange(n)[:, None] + torch.arange(steps)[None, :]  # [n, steps]: token fed at step j is x_{p+j}
    emb = embed[toks[idx.clamp(max=n - 1)]]  # [n, steps, hidden]
    feats = torch.cat([torch.zeros(1, f.shape[1]), f[:-1].float()])  # [n, taps*hidden]: features at p - 1
    ok = torch.zeros(n, steps, dtype=torch.bool)
    ok[e.prompt_len - 1:, 0] = True  # answer positions only
    follows = torch.ones(n, dtype=torch.bool)  # the text so far followed the target's choices
    d2t_inv = draft_index(head)
    for j in range(1, steps):
        nxt = torch.zeros(n, dtype=torch.bool)
        valid = torch.arange(n) + j < n
        p = torch.arange(n)[valid]
        nxt[valid] = toks[p + j] == y[p + j - 1]
        follows = follows & nxt
        ok[:, j] = ok[:, 0] & follows
    at = idx.clamp(max=n - 1).T  # [steps, n]: the position whose next token step j predicts
    tgt = d2t_inv[y[at]]  # [steps, n]
    tgt[~ok.T] = -100
    if soft is None:
        return emb, feats, tgt, None
    ids = d2t_inv[soft[0].long()[at]]  # [steps, n, top]
    prob = soft[1].float()[at].exp() * (ids >= 0)  # [steps, n, top]
    prob = prob / prob.sum(-1, keepdim=True).clamp(min=1e-9)
    return emb, feats, tgt, (ids.clamp(min=0), prob)


def loss_of(head: EagleHead, emb, feats, tgt, soft, steps: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    rows = (tgt[0] >= 0).nonzero().flatten()  # positions with a target at step 0 (later steps: a subset)
    logits = head.unrolled(emb, feats, steps, rows)
    tgt = tgt[:, rows]
    loss, stats = 0.0, []
    for j, lg in enumerate(logits):
        m = tgt[j] >= 0
        if m.any():
            if soft is None:
                step_loss = F.cross_entropy(lg[m], tgt[j][m])
            else:
                ids, prob = soft[0][j, rows][m], soft[1][j, rows][m]  # [r, top]
                step_loss = -(prob * lg[m].log_softmax(-1).gather(1, ids)).sum(-1).mean()
            loss = loss + STEP_WEIGHT ** j * step_loss
        stats.append((int((lg.argmax(-1)[m] == tgt[j][m]).sum()), int(m.sum())))
    return loss, stats


def items_of(examples: list[Example], feats: Features, soft: bool) -> list[tuple]:
    """One (example, features, labels, soft labels or None) per conversation."""
    return list(zip(examples, feats.feats, feats.labels, feats.soft if soft else [None] * len(examples)))


def held_out(items: list, share: float, rng: random.Random) -> tuple[list, list]:
    """The conversations shuffled by rng, split into (held out, trained on): `share` of them held out."""
    items = list(items)
    rng.shuffle(items)
    n = int(len(items) * share) if share > 0 else 0
    return items[:n], items[n:]


def accuracy(head: EagleHead, items, embed, steps: int) -> list[float]:
    """Per drafting step, the share of positions where the head's top choice is the target's (given that the
    earlier steps were right): a_1, a_2|1, ..."""
    hit, tot = [0] * steps, [0] * steps
    with torch.no_grad():
        for e, f, y, _ in items:
            _, stats = loss_of(head, *batch_of(e, f, y, None, embed, head, steps), steps)
            for j, (h, t) in enumerate(stats):
                hit[j], tot[j] = hit[j] + h, tot[j] + t
    return [h / max(t, 1) for h, t in zip(hit, tot)]


def tokens_per_pass(acc: list[float]) -> float:
    """Expected tokens per target pass drafting len(acc) tokens with these conditional accuracies."""
    e, run = 1.0, 1.0
    for a in acc:
        run *= a
        e += run
    return e


def resume(ckpt: Path, labels: str, head: EagleHead, opt, sched) -> dict:
    """The head, optimizer and schedule as a checkpoint left them; the training state it saved."""
    saved = torch.load(ckpt, weights_only=False)
    was = saved["state"].get("labels", "hard")  # checkpoints from before soft labels trained on hard ones
    if was != labels:
        raise SpecdecError(f"{ckpt} was trained with {was} labels: resume it with --labels {was}, or give "
                           "another --out")
    head.load_state_dict(saved["head"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    return saved["state"]


def train(head: EagleHead, target, examples: list[Example], feats: Features, cfg: TrainConfig, out: Path,
          log=print) -> dict:
    """Train in place, checkpointing to out/checkpoint.pt; returns a summary (and a curve of validation
    accuracy against training tokens)."""
    if cfg.labels not in ("soft", "hard"):
        raise SpecdecError(f"labels must be soft or hard, got {cfg.labels!r}")
    if cfg.labels == "soft" and feats.soft is None:
        raise SpecdecError("this training data holds no soft labels (it was written by an older specdec): train "
                           "with hard labels, or delete its data folder to write it again")
    rng = random.Random(cfg.seed)
    val, items = held_out(items_of(examples, feats, cfg.labels == "soft"), cfg.validation, rng)
    val = val or items[:16]  # no held-out share: the curve is measured on training conversations
    embed = target.embed
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    total = math.ceil(len(items) * cfg.epochs / cfg.accumulate)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))))
    state = {"step": 0, "seen": 0, "tokens": 0, "seconds": 0.0, "curve": [], "labels": cfg.labels}
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    if ckpt.exists():
        state = resume(ckpt, cfg.labels, head, opt, sched)
        log(f"resumed at step {state['step']} of {total}")

    def checkpoint():  # whole or not at all: a full disk keeps the last good checkpoint
        with atomic_file(ckpt) as f:
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "state": state}, f)

    def evaluate():
        head.eval()
        acc = accuracy(head, val, embed, cfg.steps)
        head.train()
        state["curve"].append({"tokens": state["tokens"], "accuracy": acc, "tokens_per_pass": tokens_per_pass(acc)})
        return acc

    if not state["curve"]:  # where the head starts (a continued head: its accuracy on the new held-out share)
        acc = evaluate()
        log(f"start: validation accuracy per step {[round(a, 3) for a in acc]}, {tokens_per_pass(acc):.2f} tokens/pass")
    head.train()
    t0 = time.perf_counter() - state["seconds"]
    bar = tqdm(total=total, initial=state["step"], desc="train-draft", unit="step", file=sys.stderr)
    stopped = False
    while state["step"] < total and not stopped:
        opt.zero_grad()
        hits = tots = 0
        for _ in range(cfg.accumulate):
            e, f, y, soft = items[state["seen"] % len(items)]
            if state["seen"] % len(items) == 0:
                rng.shuffle(items)
            state["seen"] += 1
            loss, stats = loss_of(head, *batch_of(e, f, y, soft, embed, head, cfg.steps), cfg.steps)
            if torch.is_tensor(loss):
                (loss / cfg.accumulate).backward()
                loss = loss.detach()
            hits, tots = hits + stats[0][0], tots + stats[0][1]
            state["tokens"] += stats[0][1]
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        state["step"] += 1
        state["seconds"] = time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", acc1=f"{hits / max(tots, 1):.2f}")
        if state["step"] % cfg.save_every == 0:
            acc = evaluate()
            log(f"step {state['step']}: validation accuracy per step {[round(a, 3) for a in acc]}, "
                f"{tokens_per_pass(acc):.2f} tokens/pass")
            checkpoint()
        stopped = cfg.hours is not None and state["seconds"] > cfg.hours * 3600
    bar.close()
    acc = evaluate()
    checkpoint()
    return {"steps": state["step"], "train_tokens": state["tokens"], "train_seconds": round(state["seconds"], 1),
            "validation_accuracy": acc, "validation_tokens_per_pass": tokens_per_pass(acc), "curve": state["curve"],
            "stopped_by_time": stopped}
