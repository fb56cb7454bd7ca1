"""The `specdec` command line itself: --threads is taken by every subcommand, nested ones (`bench kernels`) included,
wherever on the line it stands."""

from __future__ import annotations

import argparse

from specdec.cli import build_parser, subparsers


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) for every subcommand under `parser`, at any depth: ("bench",), ("bench", "kernels"), ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # an alias names the same parser again
                    seen.add(id(child))
                    yield (*path, name), child
                    yield from walk(child, (*path, name))


def relax(parser: argparse.ArgumentParser) -> None:
    """Nothing `parser` requires stays required (a --shape must name a shape, a --prompts file exist...), so that a
    line of only the subcommand and --threads parses: what is checked here is where --threads is taken."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            action.required = False
            if not action.option_strings:
                action.nargs = "?"


def test_threads_parses_on_every_subcommand_at_every_depth():
    root = build_parser()
    commands = list(walk(root))
    names = {" ".join(path) for path, _ in commands}
    assert {"generate", "serve", "bench", "bench kernels", "bench long-context", "bench endpoint-check"} <= names
    assert len(subparsers(root)) == len([p for p in commands if len(p[0]) == 1])
    for path, parser in commands:
        relax(parser)
        assert root.parse_args([*path, "--threads", "3"]).threads == "3", path
        assert root.parse_args(list(path)).threads is None, path  # not given: SPECDEC_THREADS or auto


def test_threads_given_before_a_nested_subcommand_is_kept():
    """argparse copies a nested subcommand's values over its parent's: its --threads must not default to None."""
    root = build_parser()
    assert root.parse_args(["bench", "--threads", "2", "kernels"]).threads == "2"
    assert root.parse_args(["bench", "--threads", "2", "kernels", "--threads", "4"]).threads == "4"
    assert root.parse_args(["bench", "kernels", "--threads", "auto"]).threads == "auto"
