"""Find and load a model: the bundled default, a Hugging Face folder, or a GGUF file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.config import SUPPORTED_TYPES
from specdec.models.linear import PRECISIONS


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


def load_model(spec: str = "default", precision: str = "fp16", device: str = "cpu") -> LoadedModel:
    import json

    from safetensors import SafetensorError

    from specdec.models.tokenizer import Tokenizer

    if precision not in PRECISIONS:
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
    try:
        if model_type in SUPPORTED_TYPES:
            from specdec.models.transformer import Transformer

            return LoadedModel(Transformer.from_dir(path, precision, device), tokenizer, name, path, "specdec")
        from specdec.models.hf_adapter import HFAdapter

        return LoadedModel(HFAdapter(path, device), tokenizer, name, path, "transformers")
    except SpecdecError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # a truncated or garbage file
        raise SpecdecError(f"{path}: cannot load the model ({type(e).__name__}: {e})") from None
