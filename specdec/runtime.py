"""Build what generation needs from a typed spec: the target model and a drafter. The command line, the
server and the benchmarks all start here."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.config import GGUF_PRECISIONS, PRECISIONS
from specdec.models.target import TargetTraits

DRAFTERS = ("ngram", "suffix", "draft-model", "eagle", "none")


@dataclass(frozen=True)
class ModelSpec:
    model: str = "default"  # 'default' (the bundled SmolLM2-135M), a Hugging Face folder or a .gguf
    drafter: str = "ngram"  # ngram | suffix | draft-model | eagle | none, or a cascade: "ngram,eagle"
    draft_model: str | None = None  # folder or .gguf of a draft model sharing the target's tokenizer
    precision: str | None = None  # default: gguf for a GGUF file on CPU, else fp16; bf16 on CUDA
    draft_precision: str | None = None  # default: the target's if given (not a gguf one), else the draft's own
    device: str = "cpu"
    ngram_max: int = 4
    ngram_min: int = 1
    draft_head: str | None = None  # folder of a head from `specdec train-draft` (default: the bundled model's)
    map_weights: bool = False  # a GGUF target's packed planes mapped from the cache (models/gguf/plane_cache.py)
    context: int | None = None  # positions a sequence may use (None: the model's; LongRoPE: past its original
    # context, its long factors)
    kv_cache: str | None = None  # the target's KV cache type (models/kv_cache.py KV_TYPES; None: f16, exact); a
    # draft model's stays f16

    def __post_init__(self) -> None:
        names = self.drafter.split(",")
        for name in names:
            if name not in DRAFTERS:
                raise SpecdecError(f"unknown drafter {name!r} (choose from {', '.join(DRAFTERS)}, or a cascade of "
                                   "them such as ngram,eagle)")
        if len(names) > 1 and ("none" in names or len(set(names)) < len(names)):
            raise SpecdecError(f"a cascade lists distinct drafters, without none: got {self.drafter!r}")
        for name in ("precision", "draft_precision"):
            p = getattr(self, name)
            if p is not None and p not in PRECISIONS:
                raise SpecdecError(f"unknown {name.replace('_', ' ')} {p!r} (choose from {', '.join(PRECISIONS)})")
        if self.device not in ("cpu", "cuda"):
            raise SpecdecError(f"unknown device {self.device!r} (cpu or cuda)")
        if "ngram" in names and not 1 <= self.ngram_min <= self.ngram_max:
            raise SpecdecError(f"n-gram sizes need 1 <= --ngram-min <= --ngram-max, got {self.ngram_min}.."
                               f"{self.ngram_max}")
        if "draft-model" in names and not self.draft_model:
            raise SpecdecError("--drafter draft-model needs --draft-model PATH")
        if self.kv_cache is not None:
            from specdec.models.kv_cache import kv_type

            kv_type(self.kv_cache)  # an unknown name: one line, before anything loads

    @classmethod
    def from_args(cls, args) -> ModelSpec:
        """From the shared command-line arguments (specdec.engine.cli.add_model_args)."""
        return cls(args.model, args.drafter, args.draft_model, args.precision, args.draft_precision, args.device,
                   args.ngram_max, args.ngram_min, getattr(args, "draft_head", None),
                   getattr(args, "map_weights", False), getattr(args, "context", None),
                   getattr(args, "kv_cache", None))


def build(spec: ModelSpec):
    """(loaded target, drafter)."""
    from specdec.models.loader import load_model

    if spec.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecdecError("--device cuda: no CUDA device is available here")
    target = load_model(spec.model, spec.precision, spec.device, spec.map_weights, spec.context, spec.kv_cache)
    return target, drafter_for(spec, target)


MODEL_FREE = ("ngram", "suffix", "none")  # drafters that need no model: they copy text


def model_free_drafter(names: str, ngram_max: int = 4, ngram_min: int = 1):
    """A drafter that needs no model (MODEL_FREE, or a cascade of them: "ngram,suffix"), for engines that run the
    target themselves (integrations/vllm.py)."""
    spec = ModelSpec(drafter=names, ngram_max=ngram_max, ngram_min=ngram_min)  # checks the names and sizes
    members = names.split(",")
    if not set(members) <= set(MODEL_FREE):
        raise SpecdecError(f"drafter {names!r}: only {', '.join(MODEL_FREE)} (or a cascade of them) run without a "
                           "model of specdec's own")
    return drafter_for(spec, None)


def _drafter(name: str, spec: ModelSpec, target):
    from specdec.drafters.base import NoDrafter
    from specdec.drafters.ngram import NgramDrafter

    if name == "ngram":
        return NgramDrafter(spec.ngram_max, spec.ngram_min)
    if name == "none":
        return NoDrafter()
    if name == "suffix":
        from specdec.drafters.suffix import SuffixDrafter

        return SuffixDrafter()
    from specdec.drafters.draft_model import DraftModelDrafter, draft_cost
    from specdec.models.loader import load_model

    if name == "eagle":
        return load_head(spec.draft_head, spec.model, target)
    # as the target's when that was chosen (a GGUF path only fits a GGUF draft: then the draft's own default)
    same = spec.precision if spec.precision not in GGUF_PRECISIONS else None
    draft = load_model(spec.draft_model, spec.draft_precision or same, spec.device)  # its KV cache f16, always
    DraftModelDrafter.check_compatible(target.tokenizer, draft.tokenizer)
    drafter = DraftModelDrafter(draft.model, target.model.cfg.vocab_size)
    # what the draft costs decides whether it can pay: said at every load (the one place it is measured at load)
    drafter.cost = draft_cost(target.model, draft.model)
    print(f"specdec: draft model {Path(spec.draft_model).name} ({TargetTraits.of(draft.model).precision}): "
          f"{drafter.cost.line()}", file=sys.stderr)
    return drafter


def load_head(path: str | None, model: str, target):
    """An EagleDrafter for `target` (a LoadedModel) from the head in `path` (None: the bundled model's), checked
    against the target it was trained for."""
    from specdec.drafters.eagle import EagleDrafter
    from specdec.heads.bundled import MIN_CONFIDENCE, head_dir, saved_for
    from specdec.heads.eagle import EagleHead

    where = head_dir(path, model)
    head = EagleHead.load(where)
    saved_for(where, target)
    traits = TargetTraits.of(target.model)
    if not traits.supports_taps:
        raise SpecdecError("--drafter eagle reads the target's hidden states, which this model's forward pass "
                           "does not expose")
    if max(head.cfg.taps) > target.model.cfg.num_layers:
        raise SpecdecError(f"{where}: the head reads layer {max(head.cfg.taps)}; the target has "
                           f"{target.model.cfg.num_layers}")
    # where the target runs on the native CPU kernels, so does the head's layer
    return EagleDrafter(head, target.model.embed, MIN_CONFIDENCE, kernels=traits.kernels)


def drafter_for(spec: ModelSpec, target):
    """The drafter (or cascade) `spec` names, for a target loaded already (`specdec expect` tries several)."""
    from specdec.drafters.cascade import CascadeDrafter

    members = [_drafter(name, spec, target) for name in spec.drafter.split(",")]
    return members[0] if len(members) == 1 else CascadeDrafter(members)
