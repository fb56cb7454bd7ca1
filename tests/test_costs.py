"""The pass costs every planner reads (engine/costs.py) and the one reading of --k and --policy
(engine/speculation.py): measured once per model, path, CPU and team, cached, read back by the next command without
measuring; measured again where a caller plans wider passes, where the entry is torn or foreign; kept in memory
where the cache cannot be written. `specdec expect` prints them with the speedup by drafter and acceptance."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main
from specdec.engine import costs
from specdec.engine.policy import PassCost
from specdec.engine.speculation import DEFAULT_K, Speculation, speculation
from specdec.errors import SpecdecError
from specdec.models.gguf.synth import write
from specdec.models.loader import load_model


@pytest.fixture
def tiny(tmp_path, monkeypatch, kernels):  # noqa: F811
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "tiny-llama.gguf", "tiny-llama", "Q4_K_M").path
    return path, load_model(str(path), "gguf-q8")


def test_measured_once_then_read_back(tiny, capsys):
    path, loaded = tiny
    capsys.readouterr()
    first = costs.target_profile(loaded, 9)
    assert "measuring this model's pass costs here, once" in capsys.readouterr().err
    assert first.verify_cost[1] == 1.0 and max(first.verify_cost) == costs.MIN_ROWS and first.step_s > 0
    assert first.precision == "gguf-q8" and first.raw["rows"] == costs.MIN_ROWS
    again = costs.target_profile(load_model(str(path), "gguf-q8"), 9)  # another load of the same file: the cache
    assert capsys.readouterr().err.count("measuring") == 0 and again.verify_cost == first.verify_cost
    assert costs.cached(load_model(str(path), "gguf-q16")) is None  # another path: its own curve


def test_measured_at_a_long_context_too_and_an_entry_without_it_stays(tiny, tmp_path, capsys):
    """128, 512 and 2048 cached tokens where the model's positions allow (tiny-llama's 8192 do); 512's curve is the
    typical one, and `auto` reads all three. An entry measured before the long point was is read back as it is."""
    _, loaded = tiny
    prof = costs.target_profile(loaded, 5)
    assert [c.context for c in prof.contexts] == [128, 512, 2048] and prof.typical_context == 512
    assert prof.verify_cost == prof.contexts[1].verify_cost and prof.step_s == prof.contexts[1].step_s
    assert [c for c, _ in PassCost.from_profile(prof).contexts] == [128, 512, 2048]
    store = tmp_path / "cache" / costs.STORE
    entries = json.loads(store.read_text())
    entries[costs.key(loaded)]["contexts"] = entries[costs.key(loaded)]["contexts"][:2]  # as cached before
    store.write_text(json.dumps(entries))
    capsys.readouterr()
    old = costs.target_profile(loaded, 5)
    assert "measuring" not in capsys.readouterr().err and [c.context for c in old.contexts] == [128, 512]


def test_wider_plans_measure_again_and_a_torn_or_foreign_entry_is_rebuilt(tiny, tmp_path, capsys):
    _, loaded = tiny
    costs.target_profile(loaded, 5)
    wide = costs.target_profile(loaded, 20)  # a server's batch plans wider passes than the entry holds
    assert max(wide.verify_cost) == 20 and costs.cached(loaded, 20) is not None
    store = tmp_path / "cache" / costs.STORE
    for broken in ('{"torn', json.dumps({costs.key(loaded): {"rows": 20, "verify_cost": {"1": -1}}})):
        store.write_text(broken)
        assert costs.cached(loaded, 5) is None
        capsys.readouterr()
        costs.target_profile(loaded, 5)
        assert "measuring" in capsys.readouterr().err and costs.cached(loaded, 5) is not None


def test_an_unwritable_cache_keeps_them_in_memory(tiny, tmp_path, capsys):
    _, loaded = tiny
    (tmp_path / "cache" / costs.STORE).mkdir(parents=True)  # a folder where the file should be
    capsys.readouterr()
    costs.target_profile(loaded, 5)
    err = capsys.readouterr().err
    assert "kept in memory only" in err and "Traceback" not in err


def test_a_profile_file_overrides(tiny, tmp_path):
    _, loaded = tiny
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"verify_cost": {"1": 1.0, "2": 1.5}, "step_s": 0.01}))
    assert costs.target_profile(loaded, 9, str(f)).verify_cost == {1: 1.0, 2: 1.5}
    assert costs.cached(loaded) is None  # nothing measured


def test_specdec_profile_measures_them_again_and_keeps_its_measurement(tiny, capsys):
    path, loaded = tiny
    assert main(["profile", "--model", str(path), "--precision", "gguf-q8", "--contexts", "16,32", "--max-rows", "6",
                 "--reps", "1", "--bandwidth-gib", "0.01", "--quiet"]) == 0
    assert "kept as tiny-llama's pass costs on this CPU (gguf-q8)" in capsys.readouterr().out
    kept = costs.target_profile(loaded, 5)
    assert "measuring" not in capsys.readouterr().err
    assert max(kept.verify_cost) == 6 and kept.typical_context == 32 and kept.draft_cost is None


@pytest.mark.parametrize("k, policy, drafter, want", [
    ("auto", None, "ngram", Speculation("auto", DEFAULT_K)),
    ("5", None, "ngram", Speculation("fixed", 5)),
    ("5", "auto", "ngram", Speculation("auto", 5)),
    (3, "fixed", "ngram", Speculation("fixed", 3)),
    ("auto", "always", "ngram", None),  # always is fixed's older spelling: it needs a number too
    (4, "always", "ngram", Speculation("fixed", 4)),
    ("auto", "never", "ngram", Speculation("never", 0)),
    ("auto", None, "none", Speculation("never", 0)),  # the drafter none means never, everywhere
])
def test_one_reading_of_k_and_policy(k, policy, drafter, want):
    if want is None:
        with pytest.raises(SpecdecError, match="--policy fixed drafts the same number of tokens every round"):
            speculation(k, policy, drafter)
    else:
        assert speculation(k, policy, drafter) == want


@pytest.mark.parametrize("k, policy, fragment", [("0", None, "--k must be an integer >= 1 or 'auto'"),
                                                  ("x", None, "--k must be an integer >= 1"),
                                                  ("300", None, "--k must be at most 256"),
                                                  ("4", "sometimes", "--policy must be one of auto, fixed, never")])
def test_bad_k_or_policy_is_one_line(k, policy, fragment):
    with pytest.raises(SpecdecError, match=fragment):
        speculation(k, policy)
    assert speculation(0, zero_is_never=True) == Speculation("never", 0)  # Python's k=0


def test_expect_prints_the_path_the_costs_and_the_speedups(tiny, capsys):
    path, _ = tiny
    assert main(["expect", "--model", str(path), "--precision", "gguf-q8", "--alphas", "0.6,0.8"]) == 0
    out = capsys.readouterr().out
    assert "path gguf-q8" in out and "a verify pass of n rows, in one-row passes: 2:" in out
    assert "pass costs measured now, and cached" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("ngram", "suffix"))}
    assert set(rows) == {"ngram", "suffix"} and all("x (k=" in line for line in rows.values())
    assert main(["expect", "--model", str(path), "--precision", "gguf-q8", "--drafter", "ngram"]) == 0
    again = capsys.readouterr()
    assert "pass costs cached from" in again.out and "measuring" not in again.err
    assert main(["expect", "--model", str(path), "--alphas", "1.5"]) == 2
    assert "--alphas must be comma-separated rates in [0, 1)" in capsys.readouterr().err
