"""The explainer page in headless Chromium: keyboard-driven readout, the JavaScript theory against
vectors.json, simulated rounds, trace replay and its errors, and a screenshot in artifacts/."""

from __future__ import annotations

import json
import math

import pytest

from specdec.explain.vectors import VECTORS_PATH
from specdec.theory import describe_speedup, expected_tokens, plan, speedup
from tests.browser.conftest import ARTIFACTS, set_slider, text

pytestmark = pytest.mark.browser


def set_settings(page, a: float, k: int, c: float) -> None:
    set_slider(page, "#alpha", a)
    set_slider(page, "#depth", k)
    set_slider(page, "#cost", c)


def test_keyboard_sliders_drive_the_readout(page):
    # a = 0.9 from the top end, c = 0.1 from the bottom: End / Home / arrows
    page.locator("#alpha").focus()
    page.keyboard.press("End")
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
    set_slider(page, "#cost", 0.1)
    assert text(page, "#alpha-value") == "0.90" and text(page, "#cost-value") == "0.10"
    assert text(page, "#readout-best") == "k = 10: 3.43x faster"
    assert "peak: k = 10, 3.43x" in page.locator("#curve").text_content()
    assert text(page, "#readout-verdict").startswith("Speculation pays")

    # PageUp moves a range input by a tenth of its span
    page.locator("#cost").focus()
    page.keyboard.press("Home")
    for _ in range(5):
        page.keyboard.press("PageUp")
    assert text(page, "#cost-value") == "0.50"
    set_slider(page, "#alpha", 0.1)
    set_slider(page, "#depth", 3)
    assert text(page, "#depth-value") == "3"
    assert text(page, "#readout-speedup") == describe_speedup(speedup(0.1, 3, 0.5))
    assert text(page, "#readout-speedup").endswith("slower than plain decoding")
    assert text(page, "#readout-verdict").startswith("No draft depth helps")
    assert text(page, "#readout-cost").startswith("2.50")


@pytest.mark.parametrize("a,k,c", [(0.75, 5, 0.05), (0.6, 8, 0.25), (0.95, 13, 0.01), (0.5, 2, 0.6)])
def test_readout_matches_python_at_a_few_points(page, a, k, c):
    set_settings(page, a, k, c)
    p = plan(a, c, max_k=20)
    assert text(page, "#readout-expected") == f"{expected_tokens(a, k):.3f} tokens"
    assert text(page, "#readout-cost").startswith(f"{1 + k * c:.2f}")
    assert text(page, "#readout-speedup") == describe_speedup(speedup(a, k, c))
    assert text(page, "#readout-best") == f"k = {p.best_k}: {describe_speedup(p.best_speedup)}"
    helps = p.beats_plain and c < p.max_useful_draft_cost
    assert text(page, "#readout-verdict").startswith("Speculation pays" if helps else "No draft depth helps")


def test_batch_panel_readout(page):
    assert text(page, "#batch-ratio-1") == "2.40x faster"
    assert text(page, "#batch-ratio-max") == "0.62x: slower than plain decoding"
    assert text(page, "#batch-crossover").startswith("batch 38")
    page.locator("#knee").fill("4096")
    assert text(page, "#batch-crossover").startswith("none")
    page.locator("#knee").fill("0")
    assert page.locator("#batch-error").is_visible()
    page.locator("#knee").fill("64")
    assert not page.locator("#batch-error").is_visible()
    assert text(page, "#batch-crossover").startswith("batch 38")


def test_js_theory_equals_vectors(page):
    vectors = json.loads(VECTORS_PATH.read_text())
    got = page.evaluate(
        """(v) => {
          const T = window.specdecTheory;
          return {
            points: v.points.map((p) => [T.expectedTokens(p.a, p.k), T.speedup(p.a, p.k, p.c)]),
            plans: v.plans.map((p) => {
              const r = T.plan(p.a, p.c, v.max_k);
              return [r.best_k, r.best_speedup, r.beats_plain, T.maxUsefulDraftCost(p.a)];
            }),
            batch: v.batch.map((b) => {
              const m = T.batchModel(b.a, b.k, b.c, b.knee_rows, b.max_batch);
              return [m.curve.map((r) => r.ratio), m.crossover_batch, m.ratio_at_batch_1, m.ratio_at_max_batch];
            }),
          };
        }""",
        vectors,
    )
    close = lambda x, y: abs(x - y) <= 1e-9
    assert len(got["points"]) == len(vectors["points"]) > 500
    for (e, s), want in zip(got["points"], vectors["points"]):
        assert close(e, want["expected_tokens"]) and close(s, want["speedup"]), want
    for (best_k, best, beats, c_star), want in zip(got["plans"], vectors["plans"]):
        assert (best_k, beats) == (want["best_k"], want["beats_plain"]), want
        assert close(best, want["best_speedup"]) and close(c_star, want["max_useful_draft_cost"]), want
    for (ratios, crossover, r1, rmax), want in zip(got["batch"], vectors["batch"]):
        assert crossover == want["crossover_batch"]
        assert close(r1, want["ratio_at_batch_1"]) and close(rmax, want["ratio_at_max_batch"])
        assert len(ratios) == len(want["ratios"]) and all(map(close, ratios, want["ratios"]))


def test_one_round_diagram(page):
    k = 6
    set_settings(page, 0.7, k, 0.1)
    seen = set()
    for _ in range(25):
        page.locator("#run-one").click()
        accepted = page.locator("#round .tok.accepted").count()
        recovered = page.locator("#round .tok.recovered").count()
        bonus = page.locator("#round .tok.bonus").count()
        discarded = page.locator("#round .tok.discarded").count()
        if bonus:
            assert (accepted, recovered, discarded) == (k, 0, 0)
        else:
            assert recovered == 1 and page.locator("#round .tok.rejected").count() == 1
            assert discarded == k - accepted - 1
        seen.add(accepted)
    assert len(seen) >= 3  # the rounds really are random


@pytest.mark.parametrize("a,k", [(0.8, 4), (0.5, 8), (0.95, 20)])
def test_thousand_rounds_match_the_formula(page, a, k):
    set_settings(page, a, k, 0.1)
    page.locator("#run-many").click()
    n = 1000
    probs = [a ** (j - 1) * (1 - a) for j in range(1, k + 1)] + [a ** k]  # P(round yields j tokens)
    mean = sum(j * p for j, p in enumerate(probs, 1))
    sd = math.sqrt(sum((j - mean) ** 2 * p for j, p in enumerate(probs, 1)))
    assert math.isclose(mean, expected_tokens(a, k))
    measured = float(text(page, "#sim-mean"))
    # 5 standard errors of a 1000-round mean, plus the 3-decimal display rounding
    assert abs(measured - mean) <= 5 * sd / math.sqrt(n) + 5e-4, (measured, mean)
    assert text(page, "#sim-rounds") == "1000"
    assert text(page, "#sim-expected").startswith(f"{mean:.3f}")
    assert page.locator("#sim-hist rect.bar").count() == k + 1


# --- traces ----------------------------------------------------------------------------------------------

# (drafted, accepted) per round; accepted == drafted makes a bonus round, including the empty draft
ROUNDS = [(4, 4), (4, 2), (3, 0), (0, 0), (4, 1), (4, 3), (2, 2)]


def make_trace(rounds=ROUNDS, k: int = 4) -> dict:
    out = []
    for i, (n, acc) in enumerate(rounds):
        out.append({
            "drafted": list(range(100 * i, 100 * i + n)),
            "drafted_text": [f" w{i}.{j}" for j in range(n - 1)] + ["<b>\n"] * (n > 0),
            "accepted": acc, "token": 7 + i, "token_text": f" t{i}",
            "kind": "bonus" if acc == n else "recovered", "draft_s": 0.0004, "verify_s": 0.02,
        })
    tokens = sum(a + 1 for _, a in rounds)
    return {"format": "specdec-trace", "version": 1, "model": "SmolLM2-135M-Instruct", "drafter": "ngram",
            "k": k, "temperature": 0.0, "prompt": "Tell me a story.", "rounds": out,
            "summary": {"alpha": 0.5, "mean_tokens_per_round": tokens / len(rounds), "rounds": len(rounds),
                        "tokens": tokens, "tokens_per_s": 50.0}}


def load_trace(page, tmp_path, content: str | dict, name: str = "trace.json") -> None:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    page.locator("#trace-file").set_input_files(str(path))


def test_load_a_trace(page, tmp_path):
    load_trace(page, tmp_path, make_trace())
    page.locator("#trace-view").wait_for(state="visible")
    drafted = sum(n for n, _ in ROUNDS)
    accepted = sum(a for _, a in ROUNDS)
    bonus = sum(1 for n, a in ROUNDS if a == n)
    alpha = accepted / drafted
    assert text(page, "#trace-rounds") == str(len(ROUNDS))
    assert text(page, "#trace-tokens") == str(accepted + len(ROUNDS))
    assert text(page, "#trace-accepted") == str(accepted)
    assert text(page, "#trace-recovered") == str(len(ROUNDS) - bonus)
    assert text(page, "#trace-bonus") == str(bonus)
    assert text(page, "#trace-alpha").startswith(f"{alpha:.3f} ({accepted} of {drafted} drafted)")
    assert text(page, "#trace-mean") == f"{(accepted + len(ROUNDS)) / len(ROUNDS):.3f}"
    assert text(page, "#trace-formula").startswith(f"{expected_tokens(alpha, 4):.3f}")
    assert not page.locator("#trace-error").is_visible()

    # the full rendering: every kind of token styled on its own, text shown literally
    view = page.locator("#trace-text")
    assert view.locator(".tok.accepted").count() == accepted
    assert view.locator(".tok.rejected").count() == len(ROUNDS) - bonus
    assert view.locator(".tok.recovered").count() == len(ROUNDS) - bonus
    assert view.locator(".tok.bonus").count() == bonus
    assert view.locator(".tok.discarded").count() == sum(n - a - 1 for n, a in ROUNDS if a < n)
    assert view.locator("b").count() == 0 and "<b>" in view.inner_text()

    # replay: step one round, then play to the end
    page.locator("#trace-step").click()
    assert text(page, "#trace-progress") == f"round 1 of {len(ROUNDS)}"
    assert view.locator(".trace-round:visible").count() == 1
    page.locator("#trace-play").click()
    done = f"round {len(ROUNDS)} of {len(ROUNDS)}"
    page.wait_for_function(f"document.getElementById('trace-progress').textContent === '{done}'")
    assert view.locator(".trace-round:visible").count() == len(ROUNDS)

    page.locator("#trace-use").click()
    assert text(page, "#alpha-value") == f"{alpha:.2f}" and text(page, "#depth-value") == "4"


BAD_TRACES = {
    "not json": ("{rounds: [", "not valid JSON"),
    "foreign json": (json.dumps({"hello": "world"}), "not a specdec trace"),
    "a list": ("[1, 2, 3]", "not a specdec trace"),
    "wrong format": (json.dumps({"format": "chrome-trace"}), 'its format is "chrome-trace"'),
    "version": (json.dumps({**make_trace(), "version": 2}), "unsupported trace version 2"),
    "rounds not a list": (json.dumps({**make_trace(), "rounds": {"0": {}}}), '"rounds" must be a list'),
    "no rounds": (json.dumps({**make_trace(), "rounds": []}), "no rounds"),
    "accepted too many": (json.dumps(make_trace([(4, 4), (3, 5)])), "round 2: accepted = 5 but only 3"),
    "bad kind": (json.dumps(make_trace([(4, 1)])).replace('"recovered"', '"maybe"'), '"kind" must be'),
    "bonus with a rejection": (json.dumps(make_trace([(4, 1)])).replace('"recovered"', '"bonus"'),
                               "must accept every drafted token"),
    "drafted beyond k": (json.dumps(make_trace([(6, 1)], k=4)), "drafted 6 tokens but the trace says k = 4"),
    "text length": (json.dumps(make_trace([(3, 1)])).replace('"<b>\\n"', '"x", "y"'), '"drafted_text" has 4'),
    "round not an object": (json.dumps({**make_trace(), "rounds": [make_trace()["rounds"][0], 3]}),
                            "round 2: expected an object"),
}


def test_trace_parser_rejects_bad_traces(page):
    """Every malformed case, through the page's parser: a readable message naming the problem."""
    for name, (content, message) in BAD_TRACES.items():
        got = page.evaluate(
            "(t) => { try { window.specdecTrace.parseTrace(t); return null; } catch (e) { return e.message; } }",
            content)
        assert got is not None and message in got, (name, got)


def test_broken_trace_shows_an_error_and_the_page_keeps_working(page, tmp_path):
    for i, name in enumerate(["not json", "foreign json", "accepted too many"]):
        content, message = BAD_TRACES[name]
        load_trace(page, tmp_path, content, name=f"broken{i}.json")
        error = page.locator("#trace-error")
        error.wait_for(state="visible")
        assert message in error.inner_text() and f"broken{i}.json" in error.inner_text()
        assert not page.locator("#trace-view").is_visible()
        # the rest of the page still answers
        set_slider(page, "#depth", 3 + i)
        assert text(page, "#depth-value") == str(3 + i)
        assert text(page, "#readout-expected") == f"{expected_tokens(0.8, 3 + i):.3f} tokens"
    # and a good trace after a bad one clears the error
    load_trace(page, tmp_path, make_trace(), name="good.json")
    page.locator("#trace-view").wait_for(state="visible")
    assert not page.locator("#trace-error").is_visible()


def test_screenshot(page, tmp_path):
    """A picture of the page in use, for people: artifacts/explainer.png."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explainer-top.png"))  # what a 1280x900 window shows first
    page.locator("#run-one").click()
    load_trace(page, tmp_path, make_trace([(4, 4), (4, 2), (4, 0), (4, 3), (0, 0), (4, 4), (4, 1)] * 3))
    page.locator("#trace-view").wait_for(state="visible")
    page.locator("#run-many").click()
    page.screenshot(path=str(ARTIFACTS / "explainer.png"), full_page=True)
    assert (ARTIFACTS / "explainer.png").stat().st_size > 10_000
