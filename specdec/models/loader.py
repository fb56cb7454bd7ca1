"""Find and load a model: the bundled default, a Hugging Face folder, or a GGUF file."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.config import GGUF_PRECISIONS, PRECISIONS, SUPPORTED_TYPES, read_config
from specdec.models.target import TargetTraits
from specdec.paths import cache_root

GEMMA_TYPES = ("gemma3_text", "gemma2")  # model_type values models.gemma3 runs


@dataclass
class LoadedModel:
    model: object  # Transformer or HFAdapter: forward(), new_cache(), cfg
    tokenizer: object  # specdec.models.text.tokenizer.Tokenizer
    name: str
    path: Path
    backend: str  # "specdec" | "transformers"


def resolve_model_dir(spec: str, lean: bool = False) -> Path:
    """'default' -> the bundled SmolLM2 (converted once); a folder -> itself; a .gguf file -> converted once
    (`lean`: its vectors only, for the gguf precisions; see gguf_convert)."""
    from specdec.models.gguf import convert as gguf_convert

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
        out = cache_root() / f"{path.stem}-{key}{'-lean' if lean else ''}"
        if not gguf_convert.is_complete(out):
            gguf_convert.convert_gguf(path, out, lean=lean)
        return out
    if not (path / "config.json").is_file():
        raise SpecdecError(f"{spec}: no config.json in this folder")
    return path


def model_name(spec: str | None, path: Path) -> str:
    """What a user would call the model: the bundled one's own name, a GGUF file's stem, a folder's name."""
    if spec in ("default", "", None):
        return "SmolLM2-135M-Instruct"
    given = Path(spec).expanduser()
    return given.stem if given.is_file() and given.suffix.lower() == ".gguf" else path.name


def default_precision(path: Path, spec: str | None, device: str, model_type: str | None) -> str | None:
    """bf16 on CUDA; on CPU, for a GGUF whose blocks the kernels read, the integer path chosen for this file on this
    CPU (models/gguf/path_choice.py): the remembered one, else None where load_model is to measure it now, else
    (a file too large to load twice) the rule's; else fp16."""
    if device == "cuda":
        return "bf16"
    if model_type in SUPPORTED_TYPES + GEMMA_TYPES:
        from specdec.kernels import decode_kernels
        from specdec.models.gguf.arch import ARCHS, for_model_type
        from specdec.models.gguf.convert import gguf_source

        # each architecture's own check (Gemma 3's without gguf-py's ~20 s read of a 262k-token vocabulary); a
        # mistral folder reads as llama
        runnable = (for_model_type(model_type) or ARCHS["llama"]).runnable
        source = gguf_source(path, spec)
        if source is not None and runnable(source) and decode_kernels() is not None:
            from specdec.models.gguf import path_choice

            choice = path_choice.remembered(source)
            if choice is not None:
                print(choice.line(), file=sys.stderr)
                return choice.precision
            if path_choice.fits_twice(source, available_bytes()):
                return None
            print(f"specdec: {path_choice.RULE} for {source.name}: too large to load on both paths and time them "
                  f"here, so the rule's path, {path_choice.RULE_WHY} (--precision overrides, `specdec choose-path` "
                  "measures)", file=sys.stderr)
            return path_choice.RULE
        if source is not None and model_type not in GEMMA_TYPES:  # say what the fp16 fallback costs, never silently
            from specdec.models.gguf.weights import fallback_note

            note = fallback_note(source)
            if note:
                print(note, file=sys.stderr)
    return "fp16"


def available_bytes() -> int | None:
    """Memory Linux can still hand out without swapping (MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def lean_load(spec: str | None, precision: str | None, device: str) -> bool:
    """Whether a .gguf model loads lean (its matrices read from the file, never dequantized to a folder): a llama,
    qwen2, qwen3, gemma2 or gemma3 file on a gguf precision, given or the default (the kernels build and read every
    matrix's type)."""
    from specdec.models.gguf.arch import ARCHS
    from specdec.models.gguf.file import architecture

    if spec in ("default", "", None) or device != "cpu" or (precision and precision not in GGUF_PRECISIONS):
        return False
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        return False
    arch = ARCHS.get(architecture(path))
    if arch is None or not arch.lean:
        return False
    from specdec.kernels import decode_kernels

    return (precision is not None or arch.runnable(path)) and decode_kernels() is not None


def longrope_line(cfg) -> str:
    """What a LongRoPE model (Phi-3.5, Phi-3 128k) runs, said at load."""
    if cfg.long_factors:
        return (f"its long factors at every position, for a context of {cfg.max_position_embeddings} (past its "
                f"original {cfg.original_context}), as llama.cpp runs them at such a context; load it without "
                f"--context, or with one up to {cfg.original_context}, for the short ones")
    return (f"its short factors, within its original context of {cfg.max_position_embeddings} positions (as "
            f"llama.cpp and transformers there); --context up to {cfg.long_context} runs its long factors")


def load_model(spec: str = "default", precision: str | None = None, device: str = "cpu",
               map_weights: bool = False, context: int | None = None, kv_cache: str | None = None) -> LoadedModel:
    """`precision` None: default_precision, measured now on a GGUF's first load here (choose_path). `map_weights`: a
    GGUF's packed planes mapped from a file in the cache, not held in this process's memory (gguf/plane_cache.py).
    `context`: positions a sequence may use (None: the model's; ModelConfig.with_context: capped at what the model
    holds, and LongRoPE's long factors past its original context). `kv_cache`: the KV cache's type (kv_cache.py
    KV_TYPES; None: f16), set on the model as it is built, before any cache is made (with_kv_cache)."""
    from specdec.models.kv_cache import kv_type
    from specdec.models.text.tokenizer import Tokenizer

    if precision is not None and precision not in PRECISIONS:
        raise SpecdecError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    kind = kv_type(kv_cache)  # an unknown name, before any conversion
    if map_weights and precision is not None and precision not in GGUF_PRECISIONS:  # before any conversion
        raise SpecdecError(f"--map-weights maps a GGUF's packed planes: it needs one of {', '.join(GGUF_PRECISIONS)}, "
                           f"not --precision {precision}")
    path = resolve_model_dir(spec, lean=lean_load(spec, precision, device))
    model_type = read_config(path).get("model_type")
    try:
        tokenizer = Tokenizer.from_dir(path)
    except SpecdecError:
        raise
    except Exception as e:  # a folder without a usable tokenizer.json
        raise SpecdecError(f"{path}: cannot load its tokenizer ({e})") from None
    name = model_name(spec, path)
    if not kind.exact and model_type not in SUPPORTED_TYPES + GEMMA_TYPES:  # before transformers loads its weights
        raise transformers_kv(kind.name, name)
    build = lambda p: _build(path, spec, p, device, map_weights, context, model_type)
    precision = precision or default_precision(path, spec, device, model_type)
    if not kind.exact:  # before any weights load, or a GGUF converts
        check_kv_before_load(path, model_type, precision, device, kind)
    # the path a GGUF is chosen for is timed on f16 caches whatever the type asked: one choice per file and CPU
    model = with_kv_cache(build(precision) if precision is not None else choose_path(path, spec, build), kind.name,
                          name)
    if model_type in SUPPORTED_TYPES and model.cfg.long_context:
        print(f"specdec: {name} uses LongRoPE: {longrope_line(model.cfg)}", file=sys.stderr)
    if not kind.exact:
        print(f"specdec: {name}: {kv_cache_line(model)}", file=sys.stderr)
    backend = "specdec" if model_type in SUPPORTED_TYPES + GEMMA_TYPES else "transformers"
    return LoadedModel(model, tokenizer, name, path, backend)


def check_kv_before_load(path: Path, model_type: str, precision: str | None, device: str, kind) -> None:
    """The model's own refusal of a cache type (transformer.check_kv_cache), from its config alone: whether
    `precision` (None: a GGUF path chosen at load) on `device` runs on the native kernels, and its head size."""
    from specdec.kernels import decode_kernels
    from specdec.models.config import ModelConfig
    from specdec.models.gemma3 import Gemma3Config
    from specdec.models.transformer import check_kv_cache, runs_native

    cfg = (Gemma3Config if model_type in GEMMA_TYPES else ModelConfig).from_dir(path)
    if model_type in GEMMA_TYPES:  # Gemma runs natively on its GGUF blocks only
        native = device == "cpu" and (precision is None or precision in GGUF_PRECISIONS)
    else:
        native = precision is None or runs_native(cfg, precision, device)
    check_kv_cache(kind, cfg.head_dim, decode_kernels() if native else None, f"{precision} on {device}")


def with_kv_cache(model, kv_cache: str, name: str):
    """`model` with its KV cache of type `kv_cache` (kv_cache.py), set before it makes any cache: its own
    use_kv_cache, which refuses in one line where its path cannot run the type. A model without one (the
    transformers adapter) keeps its own cache: f16 (the exact default) only."""
    use = TargetTraits.of(model).use_kv_cache
    if use is not None:
        use(kv_cache)
    elif kv_cache != "f16":
        raise transformers_kv(kv_cache, name)
    return model


def transformers_kv(kv_cache: str, name: str) -> SpecdecError:
    return SpecdecError(f"--kv-cache {kv_cache} needs specdec's own model code on the native kernels; {name} runs "
                        "through Hugging Face transformers, which keeps its own cache: leave --kv-cache at f16")


def kv_bytes_per_position(model) -> int | None:
    """Bytes of one position's keys and values over every layer in the model's cache, of its type and path (the
    torch path keeps fp32); None for a model that does not say (the transformers adapter)."""
    per = TargetTraits.of(model).kv_bytes_per_token
    return None if per is None else int(per())


def kv_cache_line(model) -> str:
    """The model's KV cache type and what a position of it takes, in one line (load_model says it for a type other
    than f16)."""
    from specdec.models.kv_cache import KV_TYPES, kv_type

    kind, per = kv_type(TargetTraits.of(model).kv_cache), kv_bytes_per_position(model)
    size = "" if per is None else f"{per:,} bytes a position"
    if kind.exact:
        return f"KV cache {kind.name}" + (f" ({size})" if size else "")
    f16 = KV_TYPES["f16"].bytes_per_position(model.cfg)
    return (f"KV cache {kind.name} ({kind.bytes_per_value(model.cfg.head_dim):.2f} bytes a value, "
            f"{kind.bytes_per_position(model.cfg) / f16:.0%} of f16{': ' + size if size else ''}): keys and values in "
            f"blocks of 32 as llama.cpp's {kind.name}, a slightly different model; speculation stays exact for it")


def choose_path(path: Path, spec: str, build):
    """A GGUF's first load here: the model on both integer paths, their passes timed in alternation, the faster kept
    and remembered (models/gguf/path_choice.py), said in one line."""
    import time

    from specdec.models.gguf import path_choice
    from specdec.models.gguf.convert import gguf_source

    t0 = time.perf_counter()
    models = {p: build(p) for p in path_choice.PATHS}
    choice = path_choice.decide(path_choice.measure(models), f"at first load: the lower sum of a 1-row and a "
                                f"{path_choice.ROWS}-row pass, fastest of {path_choice.REPS} alternated")
    path_choice.remember(gguf_source(path, spec), choice)
    print(choice.line(measured_now=time.perf_counter() - t0), file=sys.stderr)
    return models[choice.precision]


def _build(path: Path, spec: str, precision: str, device: str, map_weights: bool, context: int | None,
           model_type: str | None):
    """The model of a resolved folder on one precision path."""
    from safetensors import SafetensorError

    try:
        if model_type in GEMMA_TYPES:
            from specdec.models.gemma3 import Gemma3
            from specdec.models.gguf.convert import gguf_source

            gguf = gguf_source(path, spec) if precision in GGUF_PRECISIONS else None
            return Gemma3.from_dir(path, precision, device, gguf, map_weights, context)
        if model_type in SUPPORTED_TYPES:
            from specdec.models.transformer import Transformer

            gguf = None
            if precision in GGUF_PRECISIONS:
                from specdec.models.gguf.convert import gguf_source

                gguf = gguf_source(path, spec)
            return Transformer.from_dir(path, precision, device, gguf, map_weights, context)
        from specdec.models.hf_adapter import HFAdapter

        if map_weights:
            raise SpecdecError("--map-weights maps a GGUF's packed planes; this model is not a GGUF")
        return HFAdapter(path, device)
    except SpecdecError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # a truncated or garbage file
        raise SpecdecError(f"{path}: cannot load the model ({type(e).__name__}: {e})") from None
