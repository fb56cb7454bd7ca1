"""The explainer's live view in headless Chromium: served by `specdec serve` (a tiny model in a subprocess on
127.0.0.1), the page asks for the API key, polls GET /live, and after a bounded burst of completions shows the
same totals as /metrics, the theory's prediction equal to the server's own, and a drawn cost curve. Served as a
plain file, the page shows no live view and asks nothing."""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import time

import httpx
import pytest

from tests.browser.conftest import ARTIFACTS
from tests.serving import KEY, PROMPTS, Server, model_name, write_served_model

pytestmark = pytest.mark.browser

MAX_TOKENS = 24
WAIT_MS = 20_000  # any one wait on the page


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("live-model"))


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir, "--api-key", KEY, "--policy", "always", "--k", "3", "--max-batch", "4")
    yield s
    assert s.stop() == 0, s.output()


@contextlib.contextmanager
def open_tab(chromium, url: str, origin: str):
    """A fresh 1280x900 tab on `url`. Fails the test on a JavaScript error, a console error or a request off
    `origin`; a 401 from /live (the page asking before it has the right key) is expected, not an error."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors, outside = [], []

    def console(m):
        if m.type == "error" and not (m.location.get("url") == origin + "/live" and "status of 401" in m.text):
            errors.append(m.text)

    def route(r):
        if r.request.url.startswith(origin + "/") or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", console)
    tab.route("**/*", route)
    try:
        tab.goto(url)
        yield tab
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
    assert not outside, f"the page reached off its server: {outside}"


def scrape(server: Server) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    """A sample's value; 0 for a label set never counted (prometheus_client lists a child once it is used)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def finished(samples: dict) -> float:
    return sum(v for (name, _), v in samples.items() if name == "specdec:request_success_total")


def num(tab, id_: str) -> str:
    return tab.locator("#" + id_).text_content().strip()


def polls(tab) -> int:
    return int(tab.locator("#live").get_attribute("data-polls"))


def wait_for_next_polls(tab, n: int = 2) -> None:
    """n more answers rendered: the first may have been asked before the caller's last change."""
    start = polls(tab)
    tab.wait_for_function(f"+document.getElementById('live').dataset.polls >= {start + n}", timeout=WAIT_MS)


def same_to_3_significant(shown: str, value: float) -> bool:
    unit = 10.0 ** (math.floor(math.log10(abs(value))) - 2)
    return abs(float(shown) - value) <= 0.5 * unit * (1 + 1e-9)


def test_live_view_matches_the_servers_metrics(chromium, server):
    with open_tab(chromium, server.url + "/", server.url) as tab:
        # the server wants its key: the page asks for it, says so when it is wrong, and polls once it is right
        tab.wait_for_selector("#live[data-state=key] #live-key-form", state="visible", timeout=WAIT_MS)
        assert tab.locator("#live-body").is_hidden()
        tab.fill("#live-key", "not-the-key")
        tab.click("#live-key-use")
        tab.wait_for_selector("#live-key-error:has-text('refused')", timeout=WAIT_MS)
        tab.fill("#live-key", KEY)
        tab.click("#live-key-use")
        tab.wait_for_selector("#live[data-state=on] #live-body", state="visible", timeout=WAIT_MS)
        assert tab.locator("#live-key-form").is_hidden()
        assert tab.evaluate("sessionStorage.getItem('specdec-live-key')") == KEY
        assert num(tab, "live-model") == model_name(server) and num(tab, "live-max-k") == "3"

        # a bounded burst: 6 greedy completions of up to 24 tokens, 3 at a time
        client, name = server.client(), model_name(server)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda p: client.completions.create(
                model=name, prompt=p, max_tokens=MAX_TOKENS, temperature=0), PROMPTS))
        assert all(a.usage.completion_tokens > 0 for a in answers)
        deadline = time.monotonic() + 20
        while finished(scrape(server)) < len(PROMPTS) and time.monotonic() < deadline:
            time.sleep(0.1)
        wait_for_next_polls(tab)

        m = scrape(server)
        live = httpx.get(server.url + "/live", headers={"authorization": f"Bearer {KEY}"}, timeout=10).json()
        generated = metric(m, "specdec:generation_tokens_total")
        drafted = metric(m, "specdec:spec_decode_num_draft_tokens_total")
        accepted = metric(m, "specdec:spec_decode_num_accepted_tokens_total")
        assert generated == sum(a.usage.completion_tokens for a in answers) and drafted > 0
        assert num(tab, "live-generated") == str(int(generated))
        assert num(tab, "live-drafted") == str(int(drafted))
        assert num(tab, "live-accepted") == str(int(accepted))
        assert abs(float(num(tab, "live-rate")) - accepted / drafted) <= 0.0005 + 1e-12
        assert len(num(tab, "live-rate").split(".")[1]) == 3
        for reason in ("stop", "length", "abort"):
            shown = num(tab, f"live-finished-{reason}")
            assert shown == str(int(metric(m, "specdec:request_success_total", finish_reason=reason))), reason
        assert sum(int(num(tab, f"live-finished-{r}")) for r in ("stop", "length")) == len(PROMPTS)
        for i in range(3):
            per_pos = metric(m, "specdec:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
            assert num(tab, f"live-pos-{i}-accepted") == str(int(per_pos)), i
            rate = live["acceptance"]["per_position"][i]["rate"]
            assert num(tab, f"live-pos-{i}-rate") == ("-" if rate is None else f"{rate:.3f}")
        assert num(tab, "live-running") == "0" and num(tab, "live-waiting") == "0"

        # the theory fed with the measured numbers: computed in the page, equal to the server's own
        recent = live["recent"]
        assert recent["predicted"] is not None and recent["paying"] is not None, recent
        assert same_to_3_significant(num(tab, "live-predicted"), recent["predicted"]), (
            num(tab, "live-predicted"), recent)
        assert same_to_3_significant(num(tab, "live-paying"), recent["paying"])
        assert abs(float(num(tab, "live-a")) - recent["a"]) <= 0.0005 + 1e-12

        # the policy's last round, the latency table and the cost chart
        ks = num(tab, "live-last-k").split()
        assert ks and all(0 <= int(k) <= 3 for k in ks)
        assert int(num(tab, "live-last-speculating")) + int(num(tab, "live-last-plain")) == len(ks)
        assert int(num(tab, "live-ttft-count")) > 0
        p50, p90, p99 = (float(num(tab, f"live-itl-{q}")) for q in ("p50", "p90", "p99"))
        assert 0 < p50 <= p90 <= p99
        chart = tab.locator("#live-cost")
        assert int(chart.get_attribute("data-points")) == len(live["cost"]["measured"]) > 0
        assert tab.locator("#live-cost circle.live-dot").count() == len(live["cost"]["measured"])
        if live["cost"]["knee_rows"] is not None:
            assert int(chart.get_attribute("data-theory-points")) > 1
        tab.reload()  # the key stays with the tab: no question this time
        tab.wait_for_selector("#live[data-state=on] #live-body", state="visible", timeout=WAIT_MS)
        assert num(tab, "live-generated") == str(int(generated))
        ARTIFACTS.mkdir(exist_ok=True)
        tab.locator("#live").screenshot(path=str(ARTIFACTS / "explainer-live.png"))  # for people


def test_without_a_key_the_live_view_needs_none(chromium, model_dir):
    s = Server(model_dir, "--policy", "always", "--k", "2", "--max-batch", "2")
    try:
        with open_tab(chromium, s.url + "/", s.url) as tab:
            tab.wait_for_selector("#live[data-state=on] #live-body", state="visible", timeout=WAIT_MS)
            assert tab.locator("#live-key-form").is_hidden()
            assert num(tab, "live-generated") == "0" and num(tab, "live-predicted") == "-"
            assert num(tab, "live-max-k") == "2" and tab.locator("#live-positions tr").count() == 2
            s.client(None).completions.create(model=model_name(s), prompt=PROMPTS[0], max_tokens=8, temperature=0)
            wait_for_next_polls(tab)
            generated = metric(scrape(s), "specdec:generation_tokens_total")
            assert generated > 0 and num(tab, "live-generated") == str(int(generated))
    finally:
        assert s.stop() == 0, s.output()


def test_served_as_a_file_there_is_no_live_view(page):
    """`specdec explain` serves the page with Python's http.server: the page asks it no /live (the `page`
    fixture fails on a 404 in the console) and keeps its live section hidden."""
    page.wait_for_selector("#live[data-state=off]", state="attached", timeout=WAIT_MS)
    assert page.locator("#live").is_hidden()
    assert page.locator("#readout-best").text_content()


def test_opened_from_disk_there_is_no_live_view(chromium, tmp_path):
    from specdec.explain import write_page

    index = write_page(tmp_path)
    context = chromium.new_context()
    tab = context.new_page()
    errors = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        tab.goto(index.as_uri())
        tab.wait_for_selector("#live[data-state=off]", state="attached", timeout=WAIT_MS)
        assert tab.locator("#live").is_hidden() and tab.locator("#readout-best").text_content()
    finally:
        context.close()
    assert not errors, errors
