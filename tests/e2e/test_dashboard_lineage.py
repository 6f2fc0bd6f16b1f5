"""Retry and fork from the run page, in real headless Chromium against a real `pal api` and `pal
worker` on Postgres (docs/retry-and-fork.md): each button asks for confirmation, posts, and opens
the new run's page, where the run succeeds, its reused steps are marked as such (no bar: they never
ran in it) and the lineage links both ways. The tools' ledgers prove the reused steps did not run
again. Screenshots are saved under the test's tmp dir (and into $PAL_SCREENSHOTS when set)."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from tests.e2e.test_dashboard_operator import logged_in, shoot, start
from tests.e2e.test_lineage import finished, pipeline
from tests.support.api_server import Api
from tests.support.tools import calls


def confirm(page: Page, button: str, title: str) -> None:
    page.click(button)
    expect(page.locator("#lineage-confirm")).to_be_visible()
    expect(page.locator("#lineage-confirm-title")).to_have_text(title)
    page.click("#lineage-yes")


def test_retry_and_fork_buttons_make_runs_that_succeed_reusing_finished_steps(api: Api, tmp_path: Path) -> None:
    ledger, flaky = tmp_path / "ledger", tmp_path / "flaky"
    start(api, "src-ui", pipeline(ledger, flaky, failures=1) | {"name": "payments"}, {"n": 5})
    assert finished(api, "src-ui")["status"] == "failed" and calls(ledger) == ["a"]
    with logged_in(api) as page:
        page.goto(api.url + "/runs/src-ui")
        expect(page.locator("#status")).to_have_text("failed", timeout=30_000)
        expect(page.locator("#retry")).to_be_visible()
        # Cancelling the confirmation posts nothing.
        page.click("#retry")
        page.click("#lineage-cancel")
        assert api.get("/v1/runs/src-ui").json()["derived_runs"] == []
        shoot(page, tmp_path, "lineage-failed-source")

        confirm(page, "#retry", "Retry run src-ui?")
        page.wait_for_url(lambda url: not url.endswith("/runs/src-ui"))
        retried = page.url.rsplit("/", 1)[1]
        assert retried != "src-ui"
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        expect(page.locator("#source")).to_contain_text("retry of src-ui")
        expect(page.locator('tr[data-step="a"] td.status')).to_have_text("reused from src-ui")
        expect(page.locator('tr[data-step="f"] td.status')).to_have_text("completed")
        expect(page.locator('#dag g[data-node="a"]')).to_have_class("dag-node state-reused")
        expect(page.locator("#retry")).to_be_hidden()  # a succeeded run is forked, not retried
        shoot(page, tmp_path, "lineage-retried-run")
        assert calls(ledger) == ["a", "b"] and calls(flaky) == ["f", "f"]  # `a` reused, not run again

        # Fork the failed source from `b` with another input: start, a and f... f failed in the
        # source, so only start and a are reused; f runs again (now succeeding), then b with n=7.
        page.goto(api.url + "/runs/src-ui")
        expect(page.locator("#derived a.derived-run")).to_have_text([retried])
        page.select_option("#fork-step", "f")
        page.fill("#fork-input", "not json")
        page.click("#fork")
        expect(page.locator("#lineage-error")).to_contain_text("the input is not JSON")
        page.fill("#fork-input", '{"n": 7}')
        confirm(page, "#fork", "Fork run src-ui from f?")
        page.wait_for_url(lambda url: not url.endswith("/runs/src-ui"))
        forked = page.url.rsplit("/", 1)[1]
        assert forked not in ("src-ui", retried)
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        expect(page.locator("#source")).to_contain_text("fork of src-ui, from step f")
        expect(page.locator('tr[data-step="a"] td.status')).to_have_text("reused from src-ui")
        shoot(page, tmp_path, "lineage-forked-run")
    run = finished(api, forked)
    assert (run["output"], run["source_kind"], run["source_step_id"]) == (7, "fork", "f")
    assert calls(ledger) == ["a", "b", "b"] and calls(flaky) == ["f", "f", "f"]
    assert [d["run_id"] for d in api.get("/v1/runs/src-ui").json()["derived_runs"]] == [retried, forked]
