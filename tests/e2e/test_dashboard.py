"""The dashboard in real headless Chromium (Playwright driving /usr/bin/chromium) against a real
`pal api` and `pal worker`: log in, open a running run's waterfall, see steps appear live, approve
the waiting step with its button, see the run finish and download its signed receipt."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from pal.core.run_receipt import verify
from tests.support import web
from tests.support.api_server import RECEIPT_KEY, Api

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def graph() -> dict[str, object]:
    return {"nodes": [{"id": "start", "type": "trigger"},
                      {"id": "fetch", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 1.5}}},
                      {"id": "gate", "type": "approval", "data": {"prompt": "Send the refund?"}},
                      {"id": "send", "type": "tool", "data": {"tool": "echo", "args": {"sent": True}}}],
            "edges": [{"source": "start", "target": "fetch"}, {"source": "fetch", "target": "gate"},
                      {"source": "gate", "target": "send", "sourceHandle": "approved"}]}


def test_log_in_watch_the_waterfall_live_and_approve(api: Api, tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_context().new_page()
        page.goto(api.url + "/runs")
        expect(page).to_have_url(api.url + "/login")  # not logged in: sent to the form
        page.fill("#token", "wrong")
        page.click("#login")
        expect(page.locator("#error")).to_contain_text("unknown or revoked")
        page.fill("#token", api.token)
        page.click("#login")
        expect(page).to_have_url(api.url + "/runs")
        cookies = {c["name"]: c for c in page.context.cookies()}
        assert cookies["pal_token"]["httpOnly"] is True

        reply = api.post("/v1/runs", json={"graph": graph(), "run_id": "browser-1"})
        assert reply.status_code == 201
        page.goto(api.url + "/runs/browser-1")
        # Live: the napping step shows as running, then the approval waits with its buttons.
        expect(page.locator('tr[data-step="fetch"]')).to_be_visible(timeout=30_000)
        expect(page.locator('tr[data-step="gate"] td.status')).to_have_text("waiting", timeout=30_000)
        expect(page.locator("#status")).to_have_text("waiting")
        expect(page.locator("#receipt")).to_be_hidden()  # no receipt while the run is in flight
        page.screenshot(path=str(tmp_path / "waiting.png"), full_page=True)
        page.fill("#approval-gate .approval-comment", "from the dashboard")
        page.click('#approval-gate button[data-decision="approve"]')
        page.click("#confirm-yes")  # the page's own confirmation dialog
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        expect(page.locator('tr[data-step="send"] td.status')).to_have_text("completed")
        page.screenshot(path=str(tmp_path / "succeeded.png"), full_page=True)
        expect(page.locator("#receipt")).to_be_visible()  # finished: its signed receipt is offered
        with page.expect_download() as download:
            page.click("#receipt a")
        receipt = Path(download.value.path()).read_bytes()
        page.goto(api.url + "/runs")
        expect(page.locator("#runs")).to_contain_text("browser-1")
        browser.close()
    assert (tmp_path / "succeeded.png").stat().st_size > 0
    assert verify(receipt, [RECEIPT_KEY.trusted]).run_id == "browser-1"
    decided = [e for e in api.client.events("browser-1") if e.kind == "approval_decided"]
    assert len(decided) == 1 and decided[0].payload["comment"] == "from the dashboard"
    # Another tenant's run page is a 404 even with a valid cookie of its own.
    other = web.get(api.url + "/runs/browser-1", cookies={"pal_token": api.other}, timeout=10)
    assert other.status_code == 404
