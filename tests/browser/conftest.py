"""Browser-test helpers: a headless Chromium (the system one; Playwright's download is not used), the
explainer page served from a temp folder on 127.0.0.1, and keyboard control of its sliders.

Without playwright or a Chromium the browser tests skip, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from specdec.explain import make_server, write_page

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"browser tests must run under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    path = os.environ.get("SPECDEC_CHROMIUM", "/usr/bin/chromium")
    if not os.access(path, os.X_OK):
        _unavailable(f"no Chromium at {path} (set SPECDEC_CHROMIUM)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def page_url(tmp_path_factory):
    """The page as `specdec explain --out` writes it, served over HTTP from a thread."""
    index = write_page(tmp_path_factory.mktemp("explainer"))
    server = make_server(index.parent, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()


@pytest.fixture
def page(chromium, page_url):
    """A fresh 1280x900 tab on the page. Fails the test on a JavaScript error or any request off the local server."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors, outside = [], []
    origin = page_url.rsplit("/", 1)[0]
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    def route(r):
        if r.request.url.startswith(origin) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    tab.route("**/*", route)
    tab.goto(page_url)
    tab.wait_for_function("window.specdecTheory !== undefined && document.getElementById('readout-best').textContent")
    yield tab
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
    assert not outside, f"the page reached off the local server: {outside}"


def set_slider(page, selector: str, value: float) -> None:
    """Move a range input to `value` with the keyboard only: Home, PageUp (a tenth of the span) while it
    fits, then the arrow keys."""
    el = page.locator(selector)
    lo, hi, step = (float(el.get_attribute(name)) for name in ("min", "max", "step"))
    el.focus()
    page.keyboard.press("Home")
    for _ in range(int((value - lo) / ((hi - lo) / 10) + 1e-9)):
        page.keyboard.press("PageUp")
    steps = round((value - float(el.input_value())) / step)
    for _ in range(abs(steps)):
        page.keyboard.press("ArrowRight" if steps > 0 else "ArrowLeft")
    assert abs(float(el.input_value()) - value) < 1e-9, (selector, el.input_value(), value)


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()
