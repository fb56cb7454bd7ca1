"""`specdec audit`: its statistics, with their error rates measured, and the command end to end.

Pure functions: two samples of one distribution pass at about the nominal rate, and a difference of exactly the
TV distance the audit says it would detect, in the direction hardest for its test, is caught in >= 90% of
repetitions (the power statement is 95%). End to end (slow: the bundled model, ~1 minute): with three servers up
on this machine, `specdec serve`'s exact speculative mode passes against a server without speculation, and
`--lossy-typical-acceptance` is flagged, both with wide margins and fixed seeds."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import numpy as np
import pytest

from specdec.audit.stats import END, OTHER, balanced_share, bin_table, chi2_homogeneity, compare, detectable_tv
from specdec.cli import main
from tests.conftest import write_word_tokenizer
from tests.serving import Server

VOCAB = 40
PI = 1 / np.arange(1, VOCAB + 1) ** 1.2  # a Zipf-like next-token distribution
PI /= PI.sum()
POSITIONS, PROMPTS, N = 4, 2, 300
REPS = 200


def draw(rng, dists) -> list[list[int]]:
    """N completions whose position j is drawn from dists[j], independently."""
    cols = [rng.choice(VOCAB, size=N, p=d) for d in dists]
    return np.stack(cols, 1).tolist()


def audit(rng, shifted=None):
    """One simulated audit: the endpoint's prompt 0 position 2 follows `shifted` (default PI)."""
    first = [PI, PI if shifted is None else shifted] + [PI] * (POSITIONS - 2)
    endpoint = [draw(rng, first)] + [draw(rng, [PI] * POSITIONS) for _ in range(PROMPTS - 1)]
    reference = [draw(rng, [PI] * POSITIONS) for _ in range(PROMPTS)]
    return compare(endpoint, reference, POSITIONS)


# ---- pure functions ---------------------------------------------------------------------------------------------

def test_bins_keep_tokens_with_expected_count_5_and_pool_the_rest():
    a = [1] * 30 + [2] * 6 + [3] * 2 + [END] * 2
    b = [1] * 25 + [2] * 5 + [4] * 3 + [END] * 7
    t = bin_table(a, b)
    assert t.labels == (1, 2, OTHER)  # 2: pooled 11 -> expected 5.5; END (9) and the rest pooled in "other"
    assert t.counts.tolist() == [[30, 6, 4], [25, 5, 10]]
    t = bin_table([1] * 50 + [2] * 3, [1] * 50 + [3] * 3)  # "other" (6 -> 3 expected) absorbs the smallest bin
    assert t.labels == (OTHER,) and t.counts.tolist() == [[53], [53]]
    assert chi2_homogeneity(t.counts)[2] == 1.0 and detectable_tv(t.counts, 0.05) == float("inf")


def test_chi2_matches_scipy_and_the_balanced_split_is_exact():
    from scipy.stats import chi2_contingency

    counts = np.array([[30, 6, 4, 12], [25, 5, 10, 9]])
    stat, df, p = chi2_homogeneity(counts)
    ref = chi2_contingency(counts, correction=False)
    assert (stat, df) == (pytest.approx(ref.statistic), ref.dof) and p == pytest.approx(ref.pvalue)
    assert balanced_share([7, 5, 4, 3, 1]) == 0.5  # 7 + 3 = 5 + 4 + 1 (greedy would give 7 + 1 vs 5 + 4 + 3)


def test_same_distribution_passes_at_the_nominal_rate():
    rng = np.random.default_rng(1)
    results = [audit(rng) for _ in range(REPS)]
    alarms = sum(r.verdict != "lossless" for r in results) / REPS
    assert alarms < 0.1, alarms  # nominal: at most alpha = 0.05 (Bonferroni over all tests)
    assert all(r.tests == PROMPTS * POSITIONS for r in results)


def shift(d: float, direction: str) -> np.ndarray:
    """PI with mass d moved: 'hardest' from one half of the mass to the other half, in proportion; 'to-top' from
    all other tokens, in proportion, to the most frequent one (what accepting a likely draft too often does)."""
    out = PI.copy()
    if direction == "to-top":
        out[1:] *= 1 - d / PI[1:].sum()
        out[0] += d
        return out
    group = np.cumsum(PI) <= 0.5  # the most frequent tokens, ~half the mass
    out[group] += d * PI[group] / PI[group].sum()
    out[~group] -= d * PI[~group] / PI[~group].sum()
    return out


@pytest.mark.parametrize("direction", ["hardest", "to-top"])
def test_a_difference_of_the_stated_detectable_tv_is_caught(direction):
    rng = np.random.default_rng(2)
    stated = max(audit(rng).detectable_tv for _ in range(5))  # what the audit says at this sample size
    assert 0.1 < stated < 0.4, stated
    shifted = shift(stated, direction)
    assert 0.5 * np.abs(shifted - PI).sum() == pytest.approx(stated) and shifted.min() >= 0
    results = [audit(rng, shifted) for _ in range(REPS)]
    caught = sum(r.verdict == "lossy" for r in results) / REPS
    assert caught >= 0.9, caught  # the statement: >= 95%
    hit = [r for r in results if r.verdict == "lossy"]
    worst = [min(r.positions, key=lambda t: t.p) for r in hit]
    assert all((t.prompt, t.position) == (0, 2) for t in worst)  # the shifted test
    assert np.median([r.tv for r in hit]) == pytest.approx(stated, rel=0.5)


def test_a_difference_at_position_1_is_a_mismatch_and_no_variation_is_inconclusive():
    rng = np.random.default_rng(3)
    other = np.roll(PI, 1)
    endpoint = [draw(rng, [other] + [PI] * (POSITIONS - 1))]
    reference = [draw(rng, [PI] * POSITIONS)]
    assert compare(endpoint, reference, POSITIONS).verdict == "mismatch"
    same = [[[5, 6, 7]] * 50]
    r = compare(same, same, 3)
    assert r.verdict == "inconclusive" and r.detectable_tv is None


# ---- the command, without a model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("audit-tok")
    write_word_tokenizer(folder, ["<unk>", "<eos>", *[f"w{i}" for i in range(10)]])
    return folder


class Refusing(BaseHTTPRequestHandler):
    """Lists a model, and refuses every completion as a server that does not take `seed` would."""

    def do_GET(self):
        self.reply(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.reply(400, {"error": {"message": "'seed' is not supported", "type": "invalid_request_error"}})

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def run_audit(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(["audit", *args])
    return rc, out.getvalue()


def test_unreachable_and_refusing_servers_are_one_line_errors(word_tokenizer):
    from tests.serving import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    httpd = HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        live = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        rc, out = run_audit("--endpoint", dead, "--reference", live, "--tokenizer", str(word_tokenizer))
        assert rc == 2 and out.strip().splitlines()[-1].startswith(f"specdec: error: the endpoint at {dead}: "
                                                                   "unreachable")
        rc, out = run_audit("--endpoint", live, "--reference", live, "--tokenizer", str(word_tokenizer),
                            "--samples", "10")
        assert rc == 2 and "POST /v1/completions refused: HTTP 400: 'seed' is not supported" in out, out
        rc, out = run_audit("--endpoint", live, "--reference", live, "--max-tokens", "1")
        assert rc == 2 and "--max-tokens must be in 2..64" in out
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- end to end through `specdec serve` (the bundled model) ---------------------------------------------------

SERVE = ("--model", "default", "--k", "4", "--max-batch", "8")
E2E = ("--samples", "50", "--max-tokens", "6", "--seed", "0", "--json")  # 4 built-in prompts: 200 per server


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The README's audit on one host: the reference, an exact and a lossy speculative server, all three up at once
    on this machine, as a user runs them (each sizes its thread team to what the others leave it)."""
    model = tmp_path_factory.mktemp("audit") / "model"
    flags = {"reference": ("--drafter", "none"), "exact": ("--policy", "always", "--drafter", "ngram"),
             "lossy": ("--policy", "always", "--drafter", "ngram", "--lossy-typical-acceptance")}
    up: dict[str, Server] = {}
    try:
        for name, f in flags.items():
            up[name] = Server(model, *SERVE, *f)
        yield up
    finally:
        for s in up.values():
            assert s.stop() == 0, s.output()


def audit_server(servers, name: str) -> tuple[dict, str]:
    rc, out = run_audit("--endpoint", servers[name].url, "--reference", servers["reference"].url, *E2E)
    result = json.loads(out)
    assert rc == (0 if result["verdict"] == "lossless" else 1)
    return result, servers[name].output()


@pytest.mark.slow
def test_exact_speculation_passes(servers):
    r, log = audit_server(servers, "exact")
    assert r["verdict"] == "lossless", r["message"]
    assert r["p"] > 0.5, r["message"]  # a wide margin: the alarm is at 0.05
    assert r["endpoint_acceptance"] == "exact" and "LOSSY" not in log
    spec = r["endpoint_speculation"]
    assert spec["accepted_tokens"] > 0.2 * spec["drafted_tokens"] > 100  # speculation did happen, and often
    assert r["tests"] >= 20 and r["detectable_tv"] < 0.6


@pytest.mark.slow
def test_lossy_typical_acceptance_is_flagged(servers):
    r, log = audit_server(servers, "lossy")
    assert r["verdict"] == "lossy" and r["p"] < 1e-6, r["message"]  # a wide margin
    assert r["first_position_p"] > 0.5  # the prompt pass is untouched by the acceptance rule
    assert r["endpoint_acceptance"] == "lossy-typical"
    assert "warning: --lossy-typical-acceptance is LOSSY" in log and "acceptance LOSSY (typical)" in log
    # typical acceptance changes later positions of every prompt, where drafts are accepted
    differs = {t["prompt"] for t in r["positions"] if t["position"] >= 2 and t["p"] * r["tests"] < 0.05}
    assert len(differs) >= 3, r["positions"]


@pytest.fixture(scope="module")
def q8_servers(tmp_path_factory):
    """A reference and an exact speculative server, both on a q8_0 KV cache (a slightly different model than f16's)."""
    model = tmp_path_factory.mktemp("audit-q8") / "model"
    flags = {"reference": ("--drafter", "none"), "exact": ("--policy", "always", "--drafter", "ngram")}
    up: dict[str, Server] = {}
    try:
        for name, f in flags.items():
            up[name] = Server(model, *SERVE, "--kv-cache", "q8_0", *f)
        yield up
    finally:
        for s in up.values():
            assert s.stop() == 0, s.output()


@pytest.mark.slow
def test_speculation_on_a_q8_cache_is_lossless_against_a_q8_reference(q8_servers):
    r, _ = audit_server(q8_servers, "exact")
    assert r["verdict"] == "lossless", r["message"]  # seeded: the same draws every run (p 0.15 here)
    assert r["endpoint_kv_cache"] == r["reference_kv_cache"] == "q8_0" and r["kv_cache_note"] is None
    assert r["endpoint_speculation"]["accepted_tokens"] > 100


@pytest.mark.slow
def test_a_q8_endpoint_against_an_f16_reference_says_what_it_compares(servers, q8_servers):
    rc, out = run_audit("--endpoint", q8_servers["exact"].url, "--reference", servers["reference"].url, *E2E)
    r = json.loads(out)
    assert rc == (0 if r["verdict"] == "lossless" else 1)
    assert (r["endpoint_kv_cache"], r["reference_kv_cache"]) == ("q8_0", "f16")
    assert "the endpoint's KV cache is q8_0, the reference's f16" in r["kv_cache_note"]
