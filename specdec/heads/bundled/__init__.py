"""The draft heads shipped with the package: where they are, and the checks a saved head passes before use.

`smollm2-135m-instruct/` is the EAGLE-3 head for the bundled model; RECIPE.md beside it gives the command that
trained it. Turning a head into a drafter for a target is runtime.load_head's (a drafter sits above the heads).
"""

from __future__ import annotations

from pathlib import Path

from specdec.errors import SpecdecError

BUNDLED = Path(__file__).parent / "smollm2-135m-instruct"
# At temperature 0 a head stops drafting once its own estimate that the draft is still right falls below this:
# the bundled head's top-1 probability tracks its accuracy (measured on v1, the first one: 0.41 overall, 0.55
# where it says >= 0.3, 0.81 where >= 0.7, on held-out answers). With --k auto the planner then keeps the part
# of the draft that pays at the measured pass costs. On gguf-q16 a draft the head gives less than about 0.2 does
# not pay (a row beyond the first costs 0.15 to 0.30 of a one-row pass there, a step 0.06); on fp16 (0.03 and
# 0.015) the break-even is nearer 0.06, so there this floor stops some drafts that would have paid.
MIN_CONFIDENCE = 0.2


def head_dir(path: str | None, model: str) -> Path:
    """The head to use: `path`, or the bundled model's when the target is the bundled model."""
    if path:
        return Path(path)
    if model not in ("default", "", None):
        raise SpecdecError("--drafter eagle needs --draft-head DIR for a model other than the bundled one "
                           "(train one with `specdec train-draft`)")
    if not (BUNDLED / "head.json").exists():
        raise SpecdecError(f"the bundled draft head is missing from this installation ({BUNDLED})")
    return BUNDLED


def saved_for(where: Path, target) -> dict:
    """The head's saved config (head.json), refused where it names a tokenizer other than `target`'s."""
    import json

    from specdec.heads.eagle import CONFIG

    saved = json.loads((where / CONFIG).read_text())
    trained_for = saved.get("tokenizer_fingerprint")
    if trained_for and trained_for != target.tokenizer.fingerprint():
        raise SpecdecError(f"{where}: this draft head was trained for a target with another vocabulary")
    return saved
