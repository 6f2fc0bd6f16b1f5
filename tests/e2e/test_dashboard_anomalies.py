"""The dashboard shows anomalies (real headless Chromium against a real `pal api` and `pal worker`):
a loop near its cap gets a marker on its row and a line in the list under the waterfall."""

from __future__ import annotations

from playwright.sync_api import expect, sync_playwright

from tests.e2e.test_dashboard import CHROMIUM_FLAGS
from tests.support.api_server import Api


def test_an_anomaly_is_marked_on_its_step_and_listed(api: Api) -> None:
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "each", "type": "loop", "data": {
                           "items": [1, 2, 3, 4], "maxIterations": 5,
                           "body": {"id": "work", "type": "tool", "data": {"tool": "echo", "args": {"n": 1}}}}}],
             "edges": [{"source": "start", "target": "each"}]}
    assert api.post("/v1/runs", json={"graph": graph, "run_id": "loopy-1"}).status_code == 201
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_context().new_page()
        page.goto(api.url + "/login")
        page.fill("#token", api.token)
        page.click("#login")
        page.goto(api.url + "/runs/loopy-1")
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        marker = page.locator('tr[data-step="each"] .mark.anomaly')  # the loop's own row
        expect(marker).to_have_count(1)
        expect(marker).to_have_attribute("title", "anomaly: runaway_loop")
        expect(page.locator("#markers")).to_contain_text("anomaly runaway_loop on each")
        expect(page.locator("#markers")).to_contain_text("loop 'each' has 4 of at most 5 iterations")
        browser.close()
