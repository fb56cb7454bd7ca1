"""Find and load a model: the bundled default, a Hugging Face folder, or a GGUF file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.config import GGUF_PRECISIONS, PRECISIONS, SUPPORTED_TYPES


@dataclass
class LoadedModel:
    model: object  # Transformer or HFAdapter: forward(), new_cache(), cfg
    tokenizer: object  # specdec.models.tokenizer.Tokenizer
    name: str
    path: Path
    backend: str  # "specdec" | "transformers"


def resolve_model_dir(spec: str) -> Path:
    """'default' -> the bundled SmolLM2 (converted once); a folder -> itself; a .gguf file -> converted once."""
    from specdec.models import gguf_convert

    if spec in ("default", "", None):
        return gguf_convert.bundled_model_dir()
    path = Path(spec).expanduser()
    if not path.exists():
        raise SpecdecError(f"model not found: {spec}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise SpecdecError(f"{spec}: a model is a folder (config.json + safetensors) or a .gguf file")
        st = path.stat()
        key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
        out = gguf_convert.cache_root() / f"{path.stem}-{key}"
        if not gguf_convert.is_complete(out):
            gguf_convert.convert_gguf(path, out)
        return out
    if not (path / "config.json").is_file():
        raise SpecdecError(f"{spec}: no config.json in this folder")
    return path


def default_precision(path: Path, spec: str | None, device: str, model_type: str | None) -> str:
    """bf16 on CUDA; on CPU, for a llama-family GGUF whose blocks the kernels read, gguf-q16: the fastest path whose
    top-1 agreement with the fp32 model is >= 0.999 (docs/results/quality-gguf.md); else fp16."""
    if device == "cuda":
        return "bf16"
    if model_type in SUPPORTED_TYPES:
        from specdec.kernels import decode_kernels
        from specdec.models.gguf_weights import gguf_source, runnable

        source = gguf_source(path, spec)
        if source is not None and runnable(source) and decode_kernels() is not None:
            return "gguf-q16"
    return "fp16"


def load_model(spec: str = "default", precision: str | None = None, device: str = "cpu") -> LoadedModel:
    """`precision` None: default_precision."""
    import json

    from safetensors import SafetensorError

    from specdec.models.tokenizer import Tokenizer

    if precision is not None and precision not in PRECISIONS:
        raise SpecdecError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    path = resolve_model_dir(spec)
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as e:
        raise SpecdecError(f"{path}: unreadable config.json ({e})") from None
    try:
        tokenizer = Tokenizer.from_dir(path)
    except SpecdecError:
        raise
    except Exception as e:  # a folder without a usable tokenizer.json
        raise SpecdecError(f"{path}: cannot load its tokenizer ({e})") from None
    name = "SmolLM2-135M-Instruct" if spec in ("default", "", None) else path.name
    precision = precision or default_precision(path, spec, device, model_type)
    try:
        if model_type == "gemma3_text":
            from specdec.models.gemma3 import Gemma3

            return LoadedModel(Gemma3.from_dir(path, precision, device), tokenizer, name, path, "specdec")
        if model_type in SUPPORTED_TYPES:
            from specdec.models.transformer import Transformer

            gguf = None
            if precision in GGUF_PRECISIONS:
                from specdec.models.gguf_weights import gguf_source

                gguf = gguf_source(path, spec)
            model = Transformer.from_dir(path, precision, device, gguf)
            return LoadedModel(model, tokenizer, name, path, "specdec")
        from specdec.models.hf_adapter import HFAdapter

        return LoadedModel(HFAdapter(path, device), tokenizer, name, path, "transformers")
    except SpecdecError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # a truncated or garbage file
        raise SpecdecError(f"{path}: cannot load the model ({type(e).__name__}: {e})") from None
