"""The `specdec` command. Each area of the package registers its own subcommands; errors meant for people
(SpecdecError, bad arguments, unreadable files) print one line on stderr and exit with status 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from specdec.errors import SpecdecError

# Modules with a `register(subparsers)` function; each subcommand sets `func(args) -> int | None`.
COMMAND_MODULES = (
    "specdec.theory.cli",
    "specdec.engine.cli",
    "specdec.explain",
    "specdec.bench.cli",
    "specdec.bench.real_models",
    "specdec.serve.cli",
    "specdec.bench.loadtest_cli",
    "specdec.audit.cli",
    "specdec.train.cli",
    "specdec.kernels.cli",
    "specdec.models.cli",
)


class UsageError(SpecdecError):
    """A command line argparse refuses: `prog` is the (sub)command it was meant for."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block."""

    def error(self, message: str) -> None:
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Speculative decoding: faster generation, same output.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        if not argv:  # what there is to run, rather than a line saying a command is missing
            print(parser.format_help(), file=sys.stderr, end="")
            return 2
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as e:  # "specdec: error: generate: argument --k: ...", the program named once
        sub = e.prog.removeprefix("specdec").strip()
        print(f"specdec: error: {sub + ': ' if sub else ''}{e}", file=sys.stderr)
        return 2
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable or unwritable files named by the user
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"specdec: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
