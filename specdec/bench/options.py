"""Command-line pieces shared by bench's commands (`bench`, `profile`, `loadtest`, `loadtest --servers`,
`bench endpoint-check`): comma-separated integers, and the --json/--markdown/--plot files, checked before a run
so that none is lost to a bad path at its end, then each written whole or not at all (specdec.atomic).

It sits below every command module, so that the commands and the runs they start share it without importing
one another."""

from __future__ import annotations

from pathlib import Path

from specdec.atomic import check_plot_path, check_writable, write_text_atomic
from specdec.errors import SpecdecError
from specdec.outputs import check_json_file, emit_json, json_file, json_on_stdout


def parse_ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdecError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise SpecdecError(f"{name}: expected integers >= 1, got {text!r}")
    return vals


def check_outputs(args) -> None:
    """--json, --markdown and --plot, checked before the run: none of them is lost to a bad path at its end."""
    check_json_file(args)
    check_writable(args.markdown)
    check_plot_path(args.plot)
    outs = [p for p in (json_file(args), args.markdown, args.plot) if p]
    if len({Path(p).expanduser().resolve() for p in outs}) < len(outs):
        raise SpecdecError("--json, --markdown and --plot must name different files")


def show_text(args, text: str) -> None:
    """The report on stdout, unless --json alone puts the JSON there instead."""
    if not json_on_stdout(args):
        print(text)


def write_outputs(args, text: str, obj, draw) -> None:
    """--markdown gets `text`, --json `obj` (a file, or stdout), --plot `draw(path)`'s figure, each written whole or
    not at all."""
    if args.markdown:
        write_text_atomic(args.markdown, text)
    emit_json(args, obj)
    if args.plot:
        draw(args.plot)
