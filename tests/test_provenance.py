"""provenance(): every key a results JSON promises, of the right type, on any machine and outside a checkout."""

import json
import subprocess
import sys
from pathlib import Path

from specdec.provenance import ISA_FLAGS, git_revision, provenance

KEYS = {"cpu", "cores", "isa", "bandwidth_gbs", "date_utc", "git", "command", "load_avg"}


def check_types(p: dict) -> None:
    assert set(p) == KEYS
    assert isinstance(p["cpu"], str) and p["cpu"]
    assert isinstance(p["cores"], int) and p["cores"] >= 1
    assert isinstance(p["isa"], list) and set(p["isa"]) <= set(ISA_FLAGS)
    assert p["date_utc"].endswith(" UTC")
    assert isinstance(p["git"], str) and p["git"]
    assert isinstance(p["command"], str) and p["command"]
    assert len(p["load_avg"]) == 3 and all(isinstance(x, float) for x in p["load_avg"])
    json.dumps(p)  # JSON-ready as it is


def test_keys_and_types_without_bandwidth():
    p = provenance()
    check_types(p)
    assert p["bandwidth_gbs"] is None


def test_bandwidth_probe_is_a_positive_rate():
    bw = provenance(bandwidth=True)["bandwidth_gbs"]
    assert isinstance(bw, float) and 0 < bw < 10_000


def test_outside_a_git_checkout(tmp_path):
    """A directory that is no checkout gives "?", not an exception; the whole record too, run from there."""
    assert git_revision(tmp_path) == "?"
    code = "import json; from specdec.provenance import provenance; print(json.dumps(provenance()))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    check_types(json.loads(r.stdout))


def test_this_checkout_has_a_revision():
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return  # an unpacked source tree: "?" is right there, and the test above covers it
    rev = git_revision(root)
    assert rev != "?" and rev.removesuffix("-dirty").isalnum()


def test_console_script_command(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/some/venv/bin/specdec", "bench", "--prompts", "a b.jsonl"])
    assert provenance()["command"] == "specdec bench --prompts 'a b.jsonl'"


def test_bench_json_carries_the_machine():
    from specdec.bench.report import build_report

    out = build_report([], [], {}, None, None).to_json()  # as `bench --json` builds its report
    check_types(out["machine"])
    assert out["machine"]["bandwidth_gbs"] > 0  # a local run probes it


def test_profile_carries_the_machine_and_its_measured_bandwidth(tiny_model):
    from types import SimpleNamespace

    from specdec.bench.hardware.profile import profile
    from specdec.drafters.ngram import NgramDrafter

    loaded = SimpleNamespace(model=tiny_model("fp32"), name="tiny", backend="specdec", tokenizer=None)
    p = profile(loaded, NgramDrafter(4, 1), contexts=(8,), max_rows=2, reps=1, bandwidth_bytes=1 << 24,
                progress=False)
    check_types(p["machine"])
    assert p["machine"]["bandwidth_gbs"] == round(p["bandwidth"]["read_GBps"], 2)
    json.dumps(p)
