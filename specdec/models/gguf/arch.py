"""The one table of GGUF architectures specdec runs: for each `general.architecture`, the module that knows its
names, config, tokenizer and matrices. gguf_llama (llama, qwen2, qwen3, qwen3moe, phi3) and gguf_gemma3 (gemma3,
gemma2) never import each other or the converter; the converter and the loader choose through this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.models.gguf import gemma3 as gguf_gemma3
from specdec.models.gguf import llama as gguf_llama
from specdec.models.gguf import spm as gguf_spm
from specdec.models.gguf import weights as gguf_weights
from specdec.models.gguf.file import read_metadata


@dataclass(frozen=True)
class GgufArch:
    model_type: str  # config.json's model_type of the converted folder
    check_metadata: Callable[[dict[str, Any], Path], None]  # refuses what the model code does not cover
    hf_name: Callable[[str, Path], str]  # (gguf name, src) -> Hugging Face name
    hf_tensor: Callable  # (gguf name, dequantized weight, src, meta) -> (Hugging Face name, weight)
    config: Callable  # (meta, src, shapes by Hugging Face name, rope vectors by name) -> config.json dict
    tokenizer: Callable  # meta -> (tokenizers.Tokenizer, tokenizer_config dict)
    read_matrices: Callable[[Path], dict]  # the matrices as stored (gguf_weights.QTensor) by Hugging Face name
    runnable: Callable[[Path], bool]  # every matrix in a format the integer kernels read
    lean: bool  # a lean folder (vectors only; matrices read from the GGUF) loads it
    freq_factors: bool  # rope_freqs and rope_factors_* tensors are rope scaling (config), not weights


_LLAMA = dict(check_metadata=gguf_llama.check_metadata, hf_name=gguf_llama.hf_name, hf_tensor=gguf_llama.hf_tensor,
              config=gguf_llama.config, tokenizer=gguf_llama.build_tokenizer, read_matrices=gguf_llama.read_matrices,
              runnable=gguf_weights.runnable, lean=True, freq_factors=True)
ARCHS: dict[str, GgufArch] = {
    "llama": GgufArch("llama", **_LLAMA),
    "qwen2": GgufArch("qwen2", **_LLAMA),
    "qwen3": GgufArch("qwen3", **_LLAMA),
    "qwen3moe": GgufArch("qwen3_moe", **_LLAMA),
    "phi3": GgufArch("phi3", **{**_LLAMA, "hf_name": lambda name, src: gguf_llama.hf_name(name, src, "phi3")}),
    **{arch: GgufArch(
        gguf_gemma3.MODEL_TYPES[arch], check_metadata=gguf_gemma3.check_metadata, hf_name=gguf_gemma3.hf_name,
        hf_tensor=lambda name, weight, src, meta: gguf_gemma3.hf_tensor(name, weight, src),
        config=gguf_gemma3.config, tokenizer=gguf_spm.build_tokenizer, read_matrices=gguf_gemma3.read_matrices,
        runnable=gguf_gemma3.runnable, lean=True, freq_factors=False) for arch in gguf_gemma3.ARCHES},
}
assert set(gguf_llama.ARCHES) <= set(ARCHS)


def arch_of(meta: dict[str, Any], src: Path) -> GgufArch:
    """The table's entry for a file's metadata, refused when specdec does not run that architecture."""
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise SpecdecError(f"{src}: architecture {arch!r} is not supported (specdec runs "
                           f"{', '.join(list(ARCHS)[:-1])} and {list(ARCHS)[-1]})")
    return ARCHS[arch]


def for_model_type(model_type: str | None) -> GgufArch | None:
    """The entry whose converted folders have this config.json model_type (None: not from a GGUF we convert)."""
    return next((a for a in ARCHS.values() if a.model_type == model_type), None)


def metadata(reader, src: Path) -> dict[str, Any]:
    """Every metadata field as a Python value, checked by its architecture's rules."""
    meta = read_metadata(reader, src)
    arch_of(meta, src).check_metadata(meta, src)
    return meta
