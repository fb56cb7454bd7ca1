"""docs/grafana/specdec.json, the Grafana dashboard of speculative decoding: its structure imports as is (every panel
has a title, the datasource variable, targets and a place on the grid; the `prefix` variable offers specdec and
vllm), its PromQL is well formed (balanced brackets, every histogram_quantile over a _bucket series summed by
`le`), and every metric it queries is one the server exports: against the names ServerMetrics declares (fast),
and against GET /metrics of a real `specdec serve` after a few requests (slow). A misspelled metric, a broken
quantile and an unbalanced expression are fed to the same checks to show that they fail."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.serve.metrics import ServerMetrics
from tests.serving import PROMPTS, Server, post, write_served_model

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "specdec.json"
PREFIX = "${prefix}"
METRIC = re.compile(r"specdec:[a-zA-Z0-9_:]+")
SPECDEC_ONLY = "specdec only"

# vLLM's exposed names for the metrics the dashboard queries with prefix=vllm, read in vLLM's sources:
# vllm/v1/spec_decode/metrics.py (SpecDecodingProm: the four spec_decode counters, label "position"),
# vllm/v1/metrics/loggers.py (PrometheusStatLogger: the rest) and tests/entrypoints/openai/test_metrics.py
# (EXPECTED_METRICS_V1: counters exposed with "_total", histograms as _bucket). prometheus_client appends the
# "_total". vllm:inter_token_latency_seconds replaced vllm:time_per_output_token_seconds in 0.11.
VLLM_EXPORTED = {
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total",
}


# ---- the checks (plain functions, so the failure tests can feed them broken dashboards) ---------------------------

def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def targets(dashboard: dict):
    """(panel, target) for every target of every panel."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def expr_for(expr: str, prefix: str) -> str:
    return expr.replace(PREFIX, prefix)


def metric_names(dashboard: dict) -> dict[str, list[str]]:
    """{metric name: titles of the panels that query it}, with prefix=specdec."""
    names: dict[str, list[str]] = {}
    for panel, target in targets(dashboard):
        for name in METRIC.findall(expr_for(target["expr"], "specdec")):
            names.setdefault(name, []).append(panel["title"])
    return names


def exported_names(exposition: str) -> set[str]:
    """Every sample name in a Prometheus text exposition (counters with _total, histograms' _bucket/_sum/_count)."""
    return {s.name for fam in text_string_to_metric_families(exposition) for s in fam.samples}


def unknown_metrics(dashboard: dict, exported: set[str]) -> list[str]:
    """What the dashboard queries that the server does not export, with the panels that query it."""
    return [f"{name} (in {', '.join(sorted(set(titles)))})"
            for name, titles in sorted(metric_names(dashboard).items()) if name not in exported]


def closing(expr: str, start: int) -> int:
    """The index of the bracket that closes the one at `start` (-1 if none)."""
    depth = 0
    for i in range(start, len(expr)):
        if expr[i] in "([{":
            depth += 1
        elif expr[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def promql_problems(expr: str) -> list[str]:
    """Brackets that do not balance or nest, and histogram_quantile calls that are not over a _bucket series summed
    by `le` (without `le` the quantile has no buckets to interpolate and returns nothing)."""
    problems, stack = [], []
    pairs = {")": "(", "]": "[", "}": "{"}
    body = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values may hold brackets
    for i, ch in enumerate(body):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                problems.append(f"unbalanced {ch!r} at {i} in {expr}")
                return problems
    if stack:
        problems.append(f"unclosed {''.join(stack)!r} in {expr}")
        return problems
    for m in re.finditer(r"histogram_quantile\s*\(", body):
        call = body[m.start():closing(body, m.end() - 1) + 1]
        if not re.search(r"[a-zA-Z0-9_:]+_bucket\b", call):
            problems.append(f"histogram_quantile over no _bucket series: {call}")
        bys = re.findall(r"\bby\s*\(([^)]*)\)", call)
        if not any("le" in (label.strip() for label in labels.split(",")) for labels in bys):
            problems.append(f"histogram_quantile without `le` in its by (...): {call}")
    return problems


def structure_problems(dashboard: dict) -> list[str]:
    """What would keep the dashboard from importing as is, or from following the prefix variable."""
    problems = []
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if not dashboard.get(key):
            problems.append(f"no {key}")
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no datasource variable of type datasource with query prometheus")
    prefix = variables.get("prefix", {})
    options = {o["value"] for o in prefix.get("options", [])}
    if prefix.get("type") != "custom" or options != {"specdec", "vllm"} or \
            prefix.get("current", {}).get("value") != "specdec":
        problems.append(f"the prefix variable is not custom with specdec (default) and vllm: {prefix}")
    ids = [p.get("id") for p in dashboard.get("panels", [])]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"panel ids not unique: {ids}")
    for panel in dashboard.get("panels", []):
        title = panel.get("title") or f"panel {panel.get('id')}"
        if not panel.get("title"):
            problems.append(f"{title}: no title")
        if not panel.get("description"):
            problems.append(f"{title}: no description")
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{title}: datasource is not the variable: {panel.get('datasource')}")
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in "hwxy"):
            problems.append(f"{title}: gridPos unset: {grid}")
        if not panel.get("targets"):
            problems.append(f"{title}: no targets")
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"{title}: refIds not unique: {refs}")
        for t in panel.get("targets", []):
            expr = t.get("expr", "")
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{title}: a target's datasource is not the variable")
            if PREFIX not in expr or re.search(r"\b(specdec|vllm):", expr) or re.search(r"\$prefix\b", expr):
                problems.append(f"{title}: a metric not written as {PREFIX}: in {expr}")
            problems += [f"{title}: {p}" for p in promql_problems(expr)]
    return problems


def vllm_problems(dashboard: dict, exported: set[str] = VLLM_EXPORTED) -> list[str]:
    """With prefix=vllm, a metric vLLM does not export (by its sources, or a running vLLM's /metrics: tests/
    test_vllm.py) must sit in a panel whose description says "specdec only", and where the panel has other targets,
    in a target whose legend says so too."""
    problems = []
    for panel, target in targets(dashboard):
        for name in re.findall(r"vllm:[a-zA-Z0-9_:]+", expr_for(target["expr"], "vllm")):
            if name in exported:
                continue
            marked = SPECDEC_ONLY in panel["description"] and \
                (len(panel["targets"]) == 1 or SPECDEC_ONLY in target["legendFormat"])
            if not marked:
                problems.append(f"{panel['title']}: {name} is not a vLLM metric and is not marked {SPECDEC_ONLY!r}")
    return problems


def declared_names() -> set[str]:
    """The sample names ServerMetrics renders before any traffic: every metric it declares."""
    body, _ = ServerMetrics(max_k=4).render()
    return exported_names(body.decode())


# ---- fast --------------------------------------------------------------------------------------------------------

def test_the_dashboard_imports_and_queries_only_metrics_the_server_declares():
    dashboard = load()
    assert structure_problems(dashboard) == []
    assert dashboard["title"] == "specdec: speculative decoding" and 36 <= dashboard["schemaVersion"] <= 41
    assert unknown_metrics(dashboard, declared_names()) == []
    assert vllm_problems(dashboard) == []
    used = metric_names(dashboard)  # the panels the issue asks for, each on its metric
    for name in ("specdec:spec_decode_num_accepted_tokens_total", "specdec:spec_decode_num_draft_tokens_total",
                 "specdec:spec_decode_acceptance_rate", "specdec:spec_decode_num_accepted_tokens_per_pos_total",
                 "specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_plain_rows_total",
                 "specdec:tokens_per_round_sum", "specdec:tokens_per_round_count",
                 "specdec:spec_decode_acceptance_drift", "specdec:batch_size_bucket",
                 "specdec:num_requests_running", "specdec:num_requests_waiting",
                 "specdec:time_to_first_token_seconds_bucket", "specdec:inter_token_latency_seconds_bucket",
                 "specdec:prefix_cache_hits_total", "specdec:prompt_tokens_total",
                 "specdec:generation_tokens_total"):
        assert name in used, name
    quantiles = {float(q) for _, t in targets(dashboard)
                 for q in re.findall(r"histogram_quantile\(([0-9.]+), sum by \(le\) \(rate\(\$\{prefix\}:"
                                     r"(?:time_to_first_token|inter_token_latency)", t["expr"])}
    assert quantiles == {0.5, 0.9, 0.99}


def test_the_checks_catch_a_misspelled_metric_a_broken_quantile_and_unbalanced_brackets():
    dashboard = copy.deepcopy(load())
    panel, target = next((p, t) for p, t in targets(dashboard) if "spec_decode_num_drafts_total" in t["expr"])
    target["expr"] = target["expr"].replace("spec_decode_num_drafts_total", "spec_decode_num_draft_total")
    unknown = unknown_metrics(dashboard, declared_names())
    assert len(unknown) == 1 and unknown[0].startswith("specdec:spec_decode_num_draft_total")
    assert panel["title"] in unknown[0]

    assert promql_problems("histogram_quantile(0.9, sum by (instance) (rate(x_bucket[5m])))")  # no le
    assert promql_problems("histogram_quantile(0.9, sum(rate(x_sum[5m])))")  # no bucket, no le
    assert promql_problems("sum(rate(x_total[5m])")  # unclosed
    assert promql_problems("sum(rate(x_total[5m)))")  # crossed
    assert promql_problems('sum(rate(x_total{a="("}[5m]))') == []  # a bracket inside a label value is text

    dashboard["panels"][0]["targets"][0]["expr"] = "rate(specdec:generation_tokens_total[5m])"  # prefix hardcoded
    dashboard["panels"][1]["datasource"] = {"type": "prometheus", "uid": "my-prometheus"}
    dashboard["templating"]["list"][1]["options"].pop()  # no vllm option
    problems = "\n".join(structure_problems(dashboard))
    assert "not written as ${prefix}:" in problems and "datasource is not the variable" in problems
    assert "the prefix variable" in problems


def test_a_specdec_only_metric_must_say_so():
    dashboard = copy.deepcopy(load())
    panel = next(p for p in dashboard["panels"] if "acceptance_drift" in p["targets"][0]["expr"])
    panel["description"] = panel["description"].replace(SPECDEC_ONLY, "ours")
    assert vllm_problems(dashboard) == [f"{panel['title']}: vllm:spec_decode_acceptance_drift is not a vLLM metric "
                                        f"and is not marked {SPECDEC_ONLY!r}"]


# ---- slow: a real server ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_every_metric_the_dashboard_queries_is_served_at_metrics(tmp_path):
    server = Server(write_served_model(tmp_path / "model"), "--k", "3", "--policy", "always", "--max-batch", "4")
    try:
        name = httpx.get(server.url + "/v1/models", timeout=5).json()["data"][0]["id"]
        for prompt in PROMPTS[:3]:  # bounded: 3 completions of 16 tokens
            r = post(server, "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 16,
                                                 "temperature": 0}, key=None)
            assert r.status_code == 200, r.text
        exposition = httpx.get(server.url + "/metrics", timeout=5).text
    finally:
        assert server.stop() == 0, server.output()
    served = exported_names(exposition)
    assert unknown_metrics(load(), served) == []
    values = {s.name: s.value for fam in text_string_to_metric_families(exposition) for s in fam.samples}
    # the speculation panels have data: rows drafted (policy always) and rounds were counted
    assert values["specdec:spec_decode_num_drafts_total"] > 0 and values["specdec:tokens_per_round_count"] > 0
    assert values["specdec:generation_tokens_total"] > 0
