"""`--json`, with one meaning in every command: the command's result as JSON, written into FILE, or, given alone (or
as `-`), printed on stdout in place of the text. `generate --json`, `plan --json` and `bench --json FILE` all keep
working as they did: a flag printed JSON, a FILE was written; now each command takes both forms."""

from __future__ import annotations

import json

from specdec.atomic import check_writable, write_text_atomic

STDOUT = "-"


def add_json_arg(p, what: str) -> None:
    p.add_argument("--json", nargs="?", const=STDOUT, default=None, metavar="FILE",
                   help=f"{what} as JSON, written into FILE; --json alone (or -) prints it on stdout instead of text")


def json_on_stdout(args) -> bool:
    """Whether the JSON takes the text's place on stdout."""
    return getattr(args, "json", None) == STDOUT


def json_file(args) -> str | None:
    """The file the JSON goes into, if any (checked before any work by check_json_file)."""
    path = getattr(args, "json", None)
    return None if path in (None, STDOUT) else path


def check_json_file(args) -> None:
    check_writable(json_file(args))


def emit_json(args, obj, indent: int = 1) -> None:
    """obj on stdout (--json alone) or into --json FILE; nothing without --json."""
    text = json.dumps(obj, indent=indent)
    if json_on_stdout(args):
        print(text)
    elif json_file(args):
        write_text_atomic(json_file(args), text + "\n")
