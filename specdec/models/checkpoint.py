"""A model folder's weights: its safetensors files (sharded or not), read whole and checked against config.json.

Below the loader and the models: Transformer and Gemma3 read their folder here, and the loader (which picks one of
them) imports them, so neither model imports the loader back.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import SpecdecError

INDEX = "model.safetensors.index.json"


def load_weights(path: Path) -> dict:
    """Every tensor of a model folder: from the shards its index names (each must be there), else from every
    *.safetensors file in it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    files = shard_files(path) if (path / INDEX).exists() else sorted(path.glob("*.safetensors"))
    if not files:
        raise SpecdecError(f"{path}: no weights in this folder (no *.safetensors file)")
    weights = {}
    for f in files:
        try:
            weights.update(load_file(f))
        except (OSError, SafetensorError) as e:
            raise SpecdecError(f"{f}: not a readable safetensors file ({e})") from None
    return weights


def shard_files(path: Path) -> list[Path]:
    """The files the folder's safetensors index names, each checked to be there."""
    try:
        weight_map = json.loads((path / INDEX).read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise SpecdecError(f"{path / INDEX}: not a safetensors index (no 'weight_map' of tensor: file)") from None
    for name in names:
        if not isinstance(name, str) or Path(name).name != name:
            raise SpecdecError(f"{path / INDEX}: {name!r} is not a file name in this folder")
        if not (path / name).is_file():
            raise SpecdecError(f"{path}: shard {name} (named by {INDEX}) is missing")
    return [path / name for name in names]


def check_weights(weights: dict, cfg, path: Path, matrices: bool = True) -> None:
    """Every tensor config.json implies is there with its shape (lm_head.weight may be absent); without `matrices`
    (a lean conversion, gguf_convert) only the vectors and routers."""
    from specdec.models.gguf.llama import ROUTER

    for name, shape in cfg.weight_shapes().items():
        if not matrices and len(shape) >= 2 and not name.endswith(ROUTER):
            continue
        t = weights.get(name)
        if t is None and name != "lm_head.weight":
            raise SpecdecError(f"{path}: the weights have no {name}")
        if t is not None and tuple(t.shape) != shape:
            raise SpecdecError(f"{path}: {name} has shape {list(t.shape)}, but config.json implies {list(shape)}")
