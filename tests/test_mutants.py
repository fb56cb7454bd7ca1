"""The curated mutants (tests/mutants.jsonl, scripts/mutate.py) still name code that exists: every edit's text occurs
exactly once in its file, so `make mutate` plants every bug instead of stopping on a stale line. Code that moves on
must take its mutants along; CI's `make mutate-fast` checks only the fast ones."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_mutate():
    spec = importlib.util.spec_from_file_location("specdec_mutate_script", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_the_tree():
    mutate = load_mutate()
    mutants = mutate.load_mutants()
    assert len(mutants) >= 70
    assert mutate.check_applicable(mutants, ROOT) == []


def test_a_stale_mutant_is_reported(tmp_path):
    mutate = load_mutate()
    (tmp_path / "f.py").write_text("x = 1\nx = 1\n")
    stale = [mutate.Mutant("gone", "a", "b", [], False, edits=[mutate.Edit("f.py", "y = 2", "y = 3")]),
             mutate.Mutant("twice", "a", "b", [], False, edits=[mutate.Edit("f.py", "x = 1", "x = 2")]),
             mutate.Mutant("nofile", "a", "b", [], False, edits=[mutate.Edit("g.py", "x", "y")])]
    problems = mutate.check_applicable(stale, tmp_path)
    assert [p.split(":")[0] for p in problems] == ["gone", "twice", "nofile"]
    assert "found 0 times" in problems[0] and "found 2 times" in problems[1] and "no such file" in problems[2]
