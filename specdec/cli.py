"""The `specdec` command. Each area of the package registers its own subcommands; errors meant for people
(SpecdecError, bad arguments, unreadable files) print one line on stderr and exit with status 2."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specdec.errors import SpecdecError

# Modules with a `register(subparsers)` function; each subcommand sets `func(args) -> int | None`.
COMMAND_MODULES = (
    "specdec.theory.cli",
    "specdec.engine.cli",
    "specdec.explain",
    "specdec.bench.cli",
    "specdec.bench.engines.real_models",
    "specdec.bench.hardware.choose_path",
    "specdec.bench.hardware.expect",
    "specdec.serve.cli",
    "specdec.bench.serving.loadtest_cli",
    "specdec.audit.cli",
    "specdec.train.cli",
    "specdec.kernels.cli",
    "specdec.models.cli",
)
# The commands that run a model's passes in this process: they size their thread team at start and print it when
# their first pass starts.
# Every command takes --threads; the others pass it on to the servers and children they start (SPECDEC_THREADS).
RUNS_PASSES = ("generate", "demo", "serve", "bench", "profile", "train-draft", "export-draft", "choose-path",
               "expect")


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
    # plan --from-bench reads a bench report through bench's types, which live above the theory's layer
    from specdec.bench.records import measured_acceptance

    sub.choices["plan"].set_defaults(read_bench=measured_acceptance)
    for p in sub.choices.values():
        add_threads(p, default=None)
    return parser


def subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands (`bench kernels` is one of `bench`'s), each once (an alias names the
    same parser twice)."""
    found: dict[int, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update((id(p), p) for p in action.choices.values())
    return list(found.values())


def add_threads(parser: argparse.ArgumentParser, default) -> None:
    """--threads on `parser` and on every subcommand nested in it, at any depth. A nested one's default is
    SUPPRESS: argparse copies a subcommand's values over its parent's, so `bench --threads 2 kernels` keeps the 2."""
    parser.add_argument("--threads", default=default, metavar="N",
                        help="threads a pass runs on: a number, or auto (the default, or SPECDEC_THREADS): one per "
                             "CPU the affinity mask and cgroup quota allow, fewer while other processes use them")
    for child in subparsers(parser):
        add_threads(child, default=argparse.SUPPRESS)


def size_team(args) -> None:
    """--threads: checked, handed on to child processes, and the team sized (and shown) where passes run here."""
    from specdec.kernels.cores import ENV, Budget, configure

    if args.threads is not None:
        Budget.read(args.threads)  # a bad value is one line, whatever the command
        os.environ[ENV] = str(args.threads)  # servers and benchmark children started from here follow it
    if args.command in RUNS_PASSES:
        configure(args.threads, announce=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        if not argv:  # what there is to run, rather than a line saying a command is missing
            print(parser.format_help(), file=sys.stderr, end="")
            return 2
        args = parser.parse_args(argv)
        size_team(args)
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
