"""Where specdec keeps what it builds once and reuses: converted models and compiled kernels.

One folder, $SPECDEC_CACHE, else ~/.cache/specdec. It sits at the bottom of the package so that the kernels (which
build into it) and the models (which convert into it) both read it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SPECDEC_CACHE"


def cache_root() -> Path:
    """Where converted models and built kernels live: $SPECDEC_CACHE, else ~/.cache/specdec."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specdec"


def kernels_root() -> Path:
    """The kernels' part of the cache: one folder per version of their sources (kernels.kernels_dir)."""
    return cache_root() / "kernels"
