"""`specdec bench kernels | long-context | endpoint-check` (specdec/bench/suites.py): each suite a subcommand with
its own options and defaults, the old flags (`bench --kernels`) still working with a note, and every option a
suite does not read refused in one line before anything runs. Fast: the suites themselves are replaced."""

from __future__ import annotations

import pytest

from specdec.cli import main


@pytest.fixture
def ran(monkeypatch):
    """What run_suite was given, instead of running a suite."""
    import specdec.bench.suites as suites

    calls = []
    monkeypatch.setattr(suites, "run_suite", lambda args: calls.append(("suite", vars(args).copy())) or 0)
    return calls


SEEN = ("suite", "out", "quick", "max_new_tokens", "prompts", "per_category", "concurrency", "max_batch", "k")


@pytest.mark.parametrize("new, old", [
    (["bench", "kernels"], ["bench", "--kernels"]),
    (["bench", "kernels", "--quick", "--out", "X", "--max-new-tokens", "7"],
     ["bench", "--kernels", "--quick", "--out", "X", "--max-new-tokens", "7"]),
    (["bench", "long-context", "--prompts", "q.jsonl", "--quick"], ["bench", "--long-context", "--prompts", "q.jsonl",
                                                                   "--quick"]),
    (["bench", "endpoint-check", "--prompts", "q.jsonl", "--k", "3", "--max-batch", "4", "--per-category", "1"],
     ["bench", "--endpoint-check", "--prompts", "q.jsonl", "--k", "3", "--max-batch", "4", "--per-category", "1"]),
])
def test_a_subcommand_runs_what_its_old_flag_ran_and_the_flag_says_so(ran, capsys, new, old):
    assert main(new) == 0 and capsys.readouterr().err == ""
    assert main(old) == 0
    err = capsys.readouterr().err
    assert f"is now `specdec bench {new[1]}`" in err and err.count("\n") == 1
    (kind_a, a), (kind_b, b) = ran
    assert kind_a == kind_b == "suite" and {k: a[k] for k in SEEN} == {k: b[k] for k in SEEN}


def test_each_suite_gets_its_own_defaults(ran):
    for argv in (["bench", "kernels"], ["bench", "long-context", "--prompts", "q"],
                 ["bench", "endpoint-check", "--prompts", "q"]):
        assert main(argv) == 0
    (_, k), (_, lc), (_, ec) = ran
    assert (k["suite"], k["max_new_tokens"], k["out"], k["quick"]) == ("kernels", 96, "artifacts", False)
    assert (lc["suite"], lc["max_new_tokens"], lc["prompts"]) == ("long_context", 128, "q")
    assert (ec["suite"], ec["max_new_tokens"], ec["per_category"], ec["concurrency"], ec["k"], ec["max_batch"]) == (
        "endpoint_check", 64, 2, "1,4", 8, 8)


@pytest.mark.parametrize("argv, message", [
    (["bench", "kernels", "--prompts", "q"], "unrecognized arguments: --prompts q"),
    (["bench", "kernels", "--json", "x.json"], "unrecognized arguments: --json"),
    (["bench", "--json", "x.json", "kernels"], "--json does not apply to `bench kernels`"),
    (["bench", "--model", "m.gguf", "long-context", "--prompts", "q"], "--model does not apply to `bench long-con"),
    (["bench", "long-context"], "required: --prompts"),
    (["bench", "long-context", "--quick", "--prompts", "q", "--max-batch", "2"], "unrecognized arguments: --max-batch"),
    (["bench", "endpoint-check", "--prompts", "q", "--quick"], "unrecognized arguments: --quick"),
    (["bench", "endpoint-check", "--prompts", "q", "--k", "0"], "--k: must be an integer in 1..256 or auto"),
    (["bench", "--kernels", "long-context", "--prompts", "q"], "name two suites: give one"),
    (["bench", "--prompts", "q", "--quick"], "--out, --quick and --max-batch apply to the suites"),
    (["bench", "kernels", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["bench", "wall-clock"], "invalid choice: 'wall-clock'"),
])
def test_what_a_suite_does_not_read_is_refused_in_one_line(ran, capsys, argv, message):
    assert main(argv) == 2 and ran == []
    err = capsys.readouterr().err
    assert message in err and err.startswith("specdec: error: ") and err.count("\n") == 1, err


def test_plain_bench_is_still_the_spec_bench_report(monkeypatch, capsys):
    import specdec.bench.suites as suites

    monkeypatch.setattr(suites, "run_suite", lambda args: pytest.fail("a suite ran"))
    assert main(["bench", "--prompts", "/nonexistent/q.jsonl", "--max-new-tokens", "4"]) == 2
    assert "q.jsonl" in capsys.readouterr().err  # the Spec-Bench report's own check of its prompts file


def test_the_help_lists_the_suites_and_each_suite_only_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert all(s in text for s in ("kernels", "long-context", "endpoint-check"))
    with pytest.raises(SystemExit):
        main(["bench", "kernels", "--help"])
    text = capsys.readouterr().out
    assert "--quick" in text and "--out" in text and "--prompts" not in text and "--endpoint" not in text
