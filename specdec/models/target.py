"""What the engine, the drafters, the server and the benches may ask of a target model besides its passes,
declared in one place and read in one place (TargetTraits.of): the only module that probes a model's attributes.

A target model (models/transformer.py Transformer, models/gemma3.py Gemma3, models/hf_adapter.py HFAdapter) is
`forward(tokens, start, cache, ...)` and `forward_ragged(...)`, each returning logits, `new_cache(...)` and `cfg`;
one that supports taps adds `forward_tapped` and `forward_ragged_tapped`, each returning a `Tapped`. Everything
else a caller may want to know is a field of TargetTraits, with the value a model that does not declare it gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tapped:
    """A tapped pass's result (forward_tapped, forward_ragged_tapped): the logits, and the features of the tapped
    layers at every row [rows, len(taps) * hidden] (torch tensors)."""

    logits: object
    features: object


@dataclass(frozen=True)
class TargetTraits:
    """device: where a request's random stream lives. exact_kv_reuse: a prompt's keys and values do not depend on
    how its prefill is chunked or on which pass computed them (the native kernels): several prefill chunks may go
    in one pass, and a prefix cache may reuse them. supports_taps: its passes can return the hidden states of
    chosen layers, for a drafter that reads them. kernels: the native kernels module its passes run on (None:
    torch). precision: its weights' path (`gguf-q16`, `fp16`, ...). kv_cache: its KV cache's type, by name
    (models/kv_cache.py: f16, the exact default, or q8_0 or q4_0 on the native kernels), and use_kv_cache, how to
    set it (None: a model that keeps f16 only, the transformers adapter). act_bits: the integer paths' activation
    bits (None elsewhere). embed: its token embedding (a tensor, or a RowLookup of the file's rows). The costs, for
    the benches: weight bytes a token reads, multiply-adds a token, KV-cache bytes a position (a method), and
    expert_layers, a mixture's native expert layers, which count the experts each pass reads (empty for a dense
    model); these are read from the model when asked (a scheduler's start-up does not sum a model's matrices)."""

    device: object = "cpu"
    exact_kv_reuse: bool = False
    supports_taps: bool = False
    kernels: object = None
    precision: str | None = None
    act_bits: int | None = None
    embed: object = None
    kv_bytes_per_token: Callable[[], float] | None = None
    kv_cache: str = "f16"  # kv_cache.DEFAULT_KV (not imported: this module stays free of torch)
    use_kv_cache: Callable[[str | None], None] | None = None
    model: object = field(default=None, repr=False, compare=False)  # what the costs are read from

    @property
    def weight_bytes_per_token(self) -> float | None:
        return getattr(self.model, "weight_bytes_per_token", None)

    @property
    def macs_per_token(self) -> float | None:
        return getattr(self.model, "macs_per_token", None)

    @property
    def expert_layers(self) -> tuple:
        layers = (getattr(b, "experts", None) for b in getattr(self.model, "blocks", None) or [])
        return tuple(e for e in layers if hasattr(e, "touched"))

    @classmethod
    def of(cls, model) -> TargetTraits:
        # the one place that reads them with defaults: not every model class declares all of them (HFAdapter
        # declares its device and precision)
        return cls(getattr(model, "device", "cpu"), getattr(model, "exact_kv_reuse", False),
                   getattr(model, "supports_taps", False), getattr(model, "kernels", None),
                   getattr(model, "precision", None), getattr(model, "act_bits", None), getattr(model, "embed", None),
                   getattr(model, "kv_bytes_per_token", None), getattr(model, "kv_cache", "f16"),
                   getattr(model, "use_kv_cache", None), model)
