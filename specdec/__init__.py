"""specdec: speculative decoding of language models, exact and measured.

Vocabulary, used throughout: q is the draft distribution, p the target's. A round *drafts* k tokens; the
target *accepts* a prefix; the first rejected position is replaced by a *recovered* token drawn from
norm(max(0, p - q)); when every drafted token is accepted the target adds a *bonus* token.
"""

from specdec.errors import SpecdecError

__version__ = "0.1.0"


def __getattr__(name: str):  # keep `import specdec` light: torch loads on first use of the sampler
    if name in ("verify", "verify_greedy", "VerifyOutput"):
        from specdec.sampling import verify as _v

        return getattr(_v, name)
    if name in ("load", "generate", "Generator"):  # the one-import entry point (specdec/api.py)
        from specdec import api as _api

        return getattr(_api, name)
    raise AttributeError(name)


__all__ = ["SpecdecError", "load", "generate", "Generator", "verify", "verify_greedy", "VerifyOutput",
           "__version__"]
