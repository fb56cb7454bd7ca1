"""How to speculate, said one way everywhere: `--k auto|N` and `--policy auto|fixed|never` on `generate`, `demo`,
`serve` and `bench`; `k=` and `policy=` in Python (`specdec.load(...)(prompt, k=..., policy=...)`); `"k"` and
`"policy"` in $SPECDEC_VLLM.

- `auto`: each round, each row drafts from 0 up to the cap, as far as the measured pass costs and the acceptance so
  far say it pays. The cap is `--k N`, or DEFAULT_K with `--k auto`.
- `fixed`: every row drafts exactly `--k N` tokens every round (fewer only where its context or token budget ends).
- `never`: plain decoding through the same loop; the drafter `none` always means `never`.

Without `--policy`, `--k auto` (the default) means `auto` and `--k N` means `fixed` N. In Python, k = 0 means
`never`. `always` is accepted as an older spelling of `fixed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import SpecdecError
from specdec.theory.economics import read_k

DEFAULT_K = 8  # the one default cap on drafts per row and round (--k auto), for every command and the vLLM proposer
POLICIES = ("auto", "fixed", "never")
OLD_SPELLINGS = {"always": "fixed"}


@dataclass(frozen=True)
class Speculation:
    policy: str = "auto"  # auto | fixed | never
    k: int = DEFAULT_K  # auto: the most drafts a row verifies in a round; fixed: exactly this many; never: 0

    def __str__(self) -> str:
        return {"auto": f"auto (k <= {self.k})", "fixed": f"fixed (k = {self.k})"}.get(self.policy, "never")


def speculation(k: int | str | None = "auto", policy: str | None = None, drafter: str | None = None,
                names: tuple[str, str] = ("--k", "--policy"), zero_is_never: bool = False,
                where: str = "") -> Speculation:
    """The one reading of a k and a policy, as a command line, Python or $SPECDEC_VLLM gives them (`names`: how the
    caller spells the two, `where` what its error messages start with). `drafter`: its name, `none` meaning `never`."""
    kname, pname = names
    if policy is not None:
        if not isinstance(policy, str) or OLD_SPELLINGS.get(policy, policy) not in POLICIES:
            raise SpecdecError(f"{where}{pname} must be one of {', '.join(POLICIES)}, got {policy!r}")
        policy = OLD_SPELLINGS.get(policy, policy)
    depth = read_k(k, f"{where}{kname}", zero_is_never)
    if depth == 0 or drafter == "none" or policy == "never":
        return Speculation("never", 0)
    if policy == "fixed" and depth is None:
        raise SpecdecError(f"{where}{pname} fixed drafts the same number of tokens every round: give {kname} as a "
                           f"number (auto is for {pname} auto)")
    return Speculation(policy or ("auto" if depth is None else "fixed"), depth or DEFAULT_K)


def add_speculation_args(p, what: str = "each round") -> None:
    """--k and --policy, as every command that generates takes them."""
    p.add_argument("--k", default="auto", metavar="auto|N",
                   help=f"drafts per row {what}: auto (the default: up to {DEFAULT_K}, as far as it pays) or N (with "
                        "--policy auto, the cap; otherwise exactly N)")
    p.add_argument("--policy", default=None, metavar="|".join(POLICIES),
                   help="auto: each row's k (0 allowed) each round, where the measured pass costs and the acceptance "
                        "so far say it pays; fixed: --k every round; never: plain decoding (default: auto with --k "
                        "auto, fixed with --k N)")


def from_args(args, zero_is_never: bool = False) -> Speculation:
    return speculation(args.k, args.policy, getattr(args, "drafter", None), zero_is_never=zero_is_never)
