"""`specdec train-draft` (an EAGLE-3 head by self-distillation) and `specdec export-draft` (for vLLM/SGLang)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, POSITIVE
from specdec.models.target import TargetTraits

DRAFT_VOCAB = 8192  # the draft vocabulary of a fresh head: the bundled head's (it covers 97.7% of its answers)


def register(sub) -> None:
    t = sub.add_parser("train-draft", help="train a draft head (EAGLE-3) on the target's own answers")
    t.add_argument("--target", default="default", help="'default' (the bundled model), a HF folder or a .gguf")
    t.add_argument("--method", choices=("eagle",), default="eagle", help="eagle: an EAGLE-3 head (one layer)")
    t.add_argument("--draft-vocab", type=int, default=None, action=AT_LEAST_1,
                   help=f"tokens the head can draft, the most frequent (default {DRAFT_VOCAB}; with --init, the "
                        "head's)")
    t.add_argument("--init", metavar="DIR|default", default=None,
                   help="continue from a trained head (its weights and draft vocabulary) on new data, e.g. "
                        "'default', the head shipped for the bundled model; a fresh head otherwise")
    t.add_argument("--prompts", nargs="+", metavar="FILE",
                   help="Spec-Bench question.jsonl (the first items of each category, which `specdec bench` "
                        "reports, are held out) or JSONL lines of {\"prompt\": ...}")
    t.add_argument("--max-tokens", type=int, nargs="+", default=[256], action=AT_LEAST_1,
                   help="new tokens per training answer (one value, or one per --prompts file)")
    t.add_argument("--answer-precision", default=None,
                   help="the precision that writes the answers (default: the target's; gguf-q8 is faster, and the "
                        "labels are the target's own choices either way)")
    t.add_argument("--labels", choices=("hard", "soft"), default="hard",
                   help="hard: learn the target's greedy choice (the shipped head's recipe); soft: its next-token "
                        "distribution over its 16 likeliest tokens (EAGLE-3's loss; on the bundled model it tied "
                        "hard labels: docs/results/head-soft-labels.md)")
    t.add_argument("--steps", type=int, default=3, action=AT_LEAST_1,
                   help="drafting steps unrolled in training (training-time test)")
    t.add_argument("--epochs", type=float, default=4.0, action=POSITIVE)
    t.add_argument("--lr", type=float, default=1e-3, action=POSITIVE)
    t.add_argument("--hours", type=float, default=None, action=POSITIVE,
                   help="stop after this much training time (a checkpoint is kept; rerun to resume)")
    t.add_argument("--device", default="cpu", help="cpu or cuda (training only; the target runs on cpu)")
    t.add_argument("--out", required=True, metavar="DIR", help="the head, its data and checkpoints go here")
    t.set_defaults(func=train_cmd)

    e = sub.add_parser("export-draft", help="write a draft head in the format vLLM and SGLang load")
    e.add_argument("head", metavar="DIR|default", help="a head from `specdec train-draft`, or 'default' (the one "
                                                       "shipped for the bundled model)")
    e.add_argument("--format", choices=("speculators",), default="speculators")
    e.add_argument("--verifier", default=None,
                   help="the target's name or path written into the config (default: the head's target)")
    e.add_argument("--out", required=True, metavar="DIR")
    e.set_defaults(func=export_cmd)


def train_cmd(args) -> int:
    import torch

    from specdec.heads.eagle import HeadConfig, default_taps
    from specdec.models.loader import load_model
    from specdec.train import data
    from specdec.train.distill import TrainConfig, coverage, draft_vocabulary, init_head, train

    if args.device not in ("cpu", "cuda"):
        raise SpecdecError(f"unknown device {args.device!r} (cpu or cuda)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("--device cuda: no CUDA device is available here")
    out = Path(args.out)
    prompts = args.prompts or [str(Path(__file__).resolve().parents[3] / "shared/data/spec_bench/question.jsonl")]
    for p in prompts:
        if not Path(p).is_file():
            raise SpecdecError(f"no prompts file at {p} (give --prompts FILE)")
    if len(args.max_tokens) not in (1, len(prompts)):
        raise SpecdecError(f"--max-tokens takes one value or one per prompts file ({len(prompts)})")
    budgets = args.max_tokens * len(prompts) if len(args.max_tokens) == 1 else args.max_tokens
    init = init_dir(args.init, args.target, args.draft_vocab) if args.init else None
    t0 = time.perf_counter()
    target = load_model(args.target)
    if not TargetTraits.of(target.model).supports_taps:
        raise SpecdecError(f"{args.target}: this model's forward pass does not expose its hidden states")
    taps = default_taps(target.model.cfg.num_layers)
    start = start_from(init, target, taps) if args.init else None  # a head for another target: refused before work
    store = out / "data"
    if (store / "data.pt").exists():
        examples, feats, meta = data.load(store)
        print(f"train-draft: reusing {len(examples)} answers in {store}", file=sys.stderr)
    else:
        writer = load_model(args.target, args.answer_precision) if args.answer_precision else target
        examples = [e for p, n in zip(prompts, budgets) for e in data.answers(writer, data.training_texts([p]), n)]
        feats = data.hidden_states(target.model, examples, taps)
        meta = {"prompts": [str(p) for p in prompts], "answers": len(examples),
                "answer_tokens": sum(len(e.tokens) - e.prompt_len for e in examples),
                "answer_precision": writer.model.precision, "target_precision": target.model.precision,
                "seconds": round(time.perf_counter() - t0, 1)}
        data.save(store, examples, feats, meta)
    torch.manual_seed(0)  # the head's initial weights: a rerun of the same command trains the same head
    if start:
        head, init_meta = start
    else:
        vocab = args.draft_vocab or DRAFT_VOCAB
        cfg = HeadConfig.for_target(target.model.cfg, vocab, taps)
        head, init_meta = init_head(cfg, target.model, draft_vocabulary(examples, feats, vocab, cfg.target_vocab)), None
    head = head.to(args.device)
    cover = coverage(examples, feats, head.t2d.cpu())
    print(f"train-draft: {meta['answer_tokens']} answer tokens; the draft vocabulary of {head.cfg.draft_vocab} "
          f"covers {cover:.1%} of the target's choices", file=sys.stderr)
    tc = TrainConfig(steps=args.steps, epochs=args.epochs, lr=args.lr, hours=args.hours, labels=args.labels)
    summary = train(head, target.model, examples, feats, tc, out, log=lambda m: print(m, file=sys.stderr))
    recipe = "specdec " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["train-draft"] else None
    report = {"target": args.target, "data": meta, "draft_vocab_coverage": round(cover, 4), **summary,
              "recipe": recipe}
    trained = {k: report[k] for k in ("train_tokens", "train_seconds", "validation_tokens_per_pass", "recipe")}
    if init_meta is not None:
        report["init"] = trained["init"] = init_meta  # how the head it continued from was trained
    head.cpu().save(out, meta={"tokenizer_fingerprint": target.tokenizer.fingerprint(), "trained": trained})
    write_text_atomic(out / "train.json", json.dumps(report, indent=1) + "\n")
    acc = ", ".join(f"{a:.2f}" for a in summary["validation_accuracy"])
    print(f"train-draft: {summary['steps']} steps over {summary['train_tokens']} tokens in "
          f"{summary['train_seconds']:.0f} s; held-out accuracy per drafting step {acc} -> "
          f"{summary['validation_tokens_per_pass']:.2f} tokens per target pass; head in {out}")
    return 0


def init_dir(spec: str, target_spec: str, draft_vocab: int | None) -> Path:
    """--init's folder, checked before any work: 'default' is the head shipped for the bundled model."""
    from specdec.heads.bundled import BUNDLED
    from specdec.heads.eagle import CONFIG

    if spec == "default" and target_spec not in ("default", ""):
        raise SpecdecError("--init default is the head for the bundled model; give --init DIR for this target")
    src = BUNDLED if spec == "default" else Path(spec)
    try:
        saved = json.loads((src / CONFIG).read_text())
    except (OSError, json.JSONDecodeError):
        raise SpecdecError(f"--init {spec}: no draft head there (no readable {CONFIG})") from None
    if draft_vocab not in (None, saved.get("draft_vocab")):
        raise SpecdecError(f"--init {spec}: the head drafts from {saved.get('draft_vocab')} tokens; --draft-vocab "
                           f"{draft_vocab} would need a fresh head")
    return src


def start_from(src: Path, target, taps) -> tuple:
    """A trained head to continue training, checked against the target; returns it and how it was trained."""
    from specdec.heads.bundled import saved_for
    from specdec.heads.eagle import EagleHead, HeadConfig

    head = EagleHead.load(src)
    saved = saved_for(src, target)
    if head.cfg != HeadConfig.for_target(target.model.cfg, head.cfg.draft_vocab, taps):
        raise SpecdecError(f"--init {src}: that head's shape or tapped layers do not fit this target")
    return head, {"from": str(src), **saved.get("trained", {})}


def export_cmd(args) -> int:
    from specdec.heads.bundled import head_dir
    from specdec.heads.export import export_speculators

    src = head_dir(None if args.head == "default" else args.head, "default")
    written = export_speculators(src, Path(args.out), args.verifier)
    print(f"export-draft: {written}")
    return 0
