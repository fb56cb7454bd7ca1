"""What the engine needs to know about a target model besides its passes, read in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetTraits:
    """device: where a request's random stream lives. exact_kv_reuse: a prompt's keys and values do not depend on
    how its prefill is chunked or on which pass computed them (the native kernels): several prefill chunks may go
    in one pass, and a prefix cache may reuse them. supports_taps: its passes can return the hidden states of
    chosen layers, for a drafter that reads them."""

    device: object = "cpu"
    exact_kv_reuse: bool = False
    supports_taps: bool = False

    @classmethod
    def of(cls, model) -> TargetTraits:
        # the one place that reads them with defaults: not every model class declares all three (HFAdapter
        # declares only its device)
        return cls(getattr(model, "device", "cpu"), getattr(model, "exact_kv_reuse", False),
                   getattr(model, "supports_taps", False))
