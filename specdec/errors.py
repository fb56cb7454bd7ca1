"""The one exception type that reaches users: the CLI prints its message on one line and exits 2."""


class SpecdecError(Exception):
    """Bad input or an unusable resource, described for a person (no traceback is shown)."""
