"""What people give the command line, checked where it is read, each fault one line that names the flag or file.

Numeric flags: `action=ranged(low, high)` on an argument with `type=int` or `type=float` refuses a value outside the
range (and NaN or infinity) before any work starts; defaults are not checked (they are the program's own):

    p.add_argument("--top-p", type=float, default=1.0, action=ranged(0, 1, low_open=True))
    -> specdec generate: --top-p must be in (0, 1], got 1.5

Files: read_text and read_json turn a missing file, a folder, an unreadable or undecodable file, and JSON that does
not parse into a SpecdecError."""

from __future__ import annotations

import argparse
import json
import math
from functools import partial
from pathlib import Path

from specdec.errors import SpecdecError


def describe(low=None, high=None, low_open: bool = False, high_open: bool = False, integer: bool = False) -> str:
    """The range in words: '>= 1', 'positive', 'in 1..65535' (integers), 'in (0, 1]'; '' for no bounds."""
    if low is None and high is None:
        return ""
    if high is None:
        if low == 0 and low_open:
            return "positive"
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    if integer and not (low_open or high_open):
        return f"in {low}..{high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def within(value, low=None, high=None, low_open: bool = False, high_open: bool = False) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or (value < high if high_open else value <= high)
    return above and below


class Ranged(argparse.Action):
    """Stores the parsed value (or each of nargs values) if it lies in the range, else a usage error."""

    def __init__(self, option_strings, dest, low=None, high=None, low_open: bool = False, high_open: bool = False,
                 **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.bounds = (low, high, low_open, high_open)

    def __call__(self, parser, namespace, values, option_string=None):
        for value in values if isinstance(values, list) else [values]:
            if not within(value, *self.bounds):
                bounds = describe(*self.bounds, integer=self.type is int)
                parser.error(f"{option_string or self.dest} must be {bounds}, got {value}")
        setattr(namespace, self.dest, values)


def ranged(low=None, high=None, *, low_open: bool = False, high_open: bool = False):
    """The `action` of a numeric flag whose values must lie between low and high (inclusive unless *_open)."""
    return partial(Ranged, low=low, high=high, low_open=low_open, high_open=high_open)


AT_LEAST_1 = ranged(1)  # counts, token budgets, draft depths
NON_NEGATIVE = ranged(0)  # temperatures, sizes where 0 means off
POSITIVE = ranged(0, low_open=True)  # seconds, rates, sizes that cannot be zero
TOP_P = ranged(0, 1, low_open=True)
PORT = ranged(1, 65535)
SEED = ranged(0, 2**63 - 1)  # what numpy, torch and OpenAI-compatible servers all take


def read_text(path: str | Path) -> str:
    """The UTF-8 text of a file the user named."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SpecdecError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason})") from None
    except OSError as e:  # missing, a folder, no permission
        raise SpecdecError(f"cannot read {path}: {e.strerror or e}") from None


def read_json(path: str | Path):
    """The parsed contents of a JSON file the user named (any JSON value: the caller checks its shape)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def number(value, where: str, low=None, high=None, *, low_open: bool = False, high_open: bool = False,
           optional: bool = False):
    """A number read from a file, returned if it is a finite JSON number in the range (or None when optional), else
    a SpecdecError naming `where` ("profile.json: draft_cost")."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not within(value, low, high, low_open,
                                                                                    high_open):
        bounds = describe(low, high, low_open, high_open)
        kind = "a positive number" if bounds == "positive" else f"a number {bounds}".rstrip()
        raise SpecdecError(f"{where} must be {kind}, got {json.dumps(value)[:40]}")
    return value
