"""The one set of number and table formatters every bench report writes with: a missing value prints as "-"."""

from __future__ import annotations


def num(v: float | None, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    """v * scale with `digits` decimals and a suffix ("x", "%", " ms"); "-" for None."""
    return "-" if v is None else f"{v * scale:.{digits}f}{suffix}"


def speedup(v: float | None, digits: int = 2) -> str:
    """A ratio as a speedup (1.234 -> "1.23x"); "-" for None."""
    return num(v, digits, suffix="x")


def signed_pct(v: float | None) -> str:
    """A relative change as a signed whole percentage (0.05 -> "+5%"); "-" for None."""
    return "-" if v is None else f"{v * 100:+.0f}%"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is missing or b is 0."""
    return a / b if a is not None and b else None


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
