"""Benchmark prompts: Spec-Bench and plain JSONL, the category filter and cap, and bad input through the CLI
(one line on stderr, exit 2, before any model loads)."""

from __future__ import annotations

import json

import pytest

from specdec.bench.prompts import CUSTOM, load_prompts, select
from specdec.cli import main
from specdec.errors import SpecdecError

SPEC_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write an email.", "Critique it."]},
    {"question_id": 83, "category": "coding", "turns": ["Reverse a list.", "Now in C."]},
    {"question_id": 84, "category": "translation", "turns": ["Translate: hallo"], "reference": ["hello"]},
    {"question_id": 85, "category": "writing", "turns": ["Write a limerick.", "Another."]},
]


def write_jsonl(path, rows, extra_lines=()):
    path.write_text("\n".join([json.dumps(r) for r in rows] + list(extra_lines)) + "\n")
    return path


def test_spec_bench_format(tmp_path):
    ps = load_prompts(write_jsonl(tmp_path / "q.jsonl", SPEC_BENCH, ["", "   "]))  # blank lines are skipped
    assert [p.qid for p in ps] == ["81", "82", "83", "84", "85"]
    assert ps[0].category == "writing" and ps[0].turns == ("Write a poem.", "Now shorter.")
    assert ps[3].turns == ("Translate: hallo",)


def test_plain_jsonl_is_category_custom(tmp_path):
    ps = load_prompts(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hello"}, {"prompt": "Bye", "id": "x"}]))
    assert [(p.qid, p.category, p.turns) for p in ps] == [("1", CUSTOM, ("Hello",)), ("x", CUSTOM, ("Bye",))]


def test_category_filter_and_per_category(tmp_path):
    ps = load_prompts(write_jsonl(tmp_path / "q.jsonl", SPEC_BENCH))
    assert [p.qid for p in select(ps)] == ["81", "82", "83", "84", "85"]
    assert [p.qid for p in select(ps, ["writing"], 2)] == ["81", "82"]
    assert [p.qid for p in select(ps, ["coding", "writing"], 1)] == ["81", "83"]  # file order
    assert [p.qid for p in select(ps, None, 1)] == ["81", "83", "84"]


def test_unknown_category_lists_the_valid_ones(tmp_path):
    ps = load_prompts(write_jsonl(tmp_path / "q.jsonl", SPEC_BENCH))
    with pytest.raises(SpecdecError, match="unknown category poetry .this file has: writing, coding, translation"):
        select(ps, ["poetry"])


@pytest.mark.parametrize("line,needle", [
    ("{not json", "q.jsonl:3: not valid JSON"),
    ('{"turns": [], "category": "x"}', "q.jsonl:3: 'turns' must be a non-empty list"),
    ('{"turns": ["a"]}', "q.jsonl:3: a Spec-Bench item needs a 'category'"),
    ('{"prompt": ""}', "q.jsonl:3: 'prompt' must be a non-empty string"),
    ('[1, 2]', "q.jsonl:3: expected an object with 'turns'"),
    ('{"question_id": 81, "category": "x", "turns": ["a"]}', "q.jsonl:3: duplicate question id 81"),
])
def test_malformed_line_names_its_number(tmp_path, line, needle):
    path = write_jsonl(tmp_path / "q.jsonl", SPEC_BENCH[:2], [line])
    with pytest.raises(SpecdecError) as e:
        load_prompts(path)
    assert needle in str(e.value)


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("make,extra,needle", [
    (lambda d: d / "missing.jsonl", [], "prompt file not found"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH, ["{oops"]), [], "q.jsonl:6: not valid JSON"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH), ["--categories", "poetry"],
     "unknown category poetry (this file has: writing, coding, translation)"),
    (lambda d: write_jsonl(d / "q.jsonl", []), [], "no prompts in this file"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH), ["--per-category", "0"], "--per-category must be >= 1"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH), ["--k", "zero"], "--k must be an integer >= 1 or 'auto'"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH), ["--json", "/no/such/dir/out.json"], "folder does not exist"),
    (lambda d: write_jsonl(d / "q.jsonl", SPEC_BENCH), ["--profile", "/no/such/profile.json"], "No such file"),
])
def test_bench_bad_input_is_one_line_and_exit_2(capsys, tmp_path, make, extra, needle):
    code, out, err = _cli(capsys, "bench", "--prompts", str(make(tmp_path)), *extra)
    assert code == 2 and needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_profile_bad_contexts(capsys):
    code, _, err = _cli(capsys, "profile", "--contexts", "128,abc")
    assert code == 2 and "--contexts: expected comma-separated integers" in err and len(err.splitlines()) == 1
