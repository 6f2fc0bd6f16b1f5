"""The operator's run page in real headless Chromium (Playwright driving /usr/bin/chromium) against a
real `pal api` and real `pal worker`s on Postgres: a failed step's error in the step panel, an
approval decided with a comment after reading its `show` payload, the waterfall of a run whose
worker was SIGKILLed mid-step (two bars, dead time, the recovery tick), the DAG coloured by step
state, and the runs list's filters and pages. Each test saves screenshots under its tmp dir (and
into $PAL_SCREENSHOTS when set)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect, sync_playwright

from pal.cli.demo import wait_until
from pal.core.clock import utcnow
from tests.e2e.test_dashboard import CHROMIUM_FLAGS
from tests.support.api_server import Api
from tests.support.processes import Processes

HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@contextmanager
def logged_in(api: Api) -> Iterator[Page]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_context(viewport={"width": 1500, "height": 950}).new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))  # an alert() would be XSS
        page.goto(api.url + "/login")
        page.fill("#token", api.token)
        page.click("#login")
        expect(page).to_have_url(api.url + "/runs")
        yield page
        assert dialogs == []
        browser.close()


def shoot(page: Page, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    if os.environ.get("PAL_SCREENSHOTS"):
        target = Path(os.environ["PAL_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)
    return path


def start(api: Api, run_id: str, graph: dict[str, Any], run_input: Any = None) -> None:
    reply = api.post("/v1/runs", json={"graph": graph, "run_id": run_id, "input": run_input})
    assert reply.status_code == 201, reply.text


def test_a_failed_steps_error_and_traceback_in_the_step_panel(api: Api, tmp_path: Path) -> None:
    graph = {"name": "refunds", "nodes": [
        {"id": "start", "type": "trigger"},
        {"id": "charge", "type": "tool", "data": {"tool": "explode", "args": {"message": "card declined " + HOSTILE}}},
        {"id": "notify", "type": "tool", "data": {"tool": "echo", "args": {"sent": True}}}],
        "edges": [{"source": "start", "target": "charge"}, {"source": "charge", "target": "notify"}]}
    start(api, "failing-1", graph)
    with logged_in(api) as page:
        page.goto(api.url + "/runs/failing-1")
        expect(page.locator("#status")).to_have_text("failed", timeout=30_000)
        # The run's error is on the page before any click: the step, the error and its message, as text.
        expect(page.locator("#run-error")).to_be_visible()
        expect(page.locator("#run-error")).to_contain_text("failed at step charge: RuntimeError: card declined "
                                                           + HOSTILE)
        expect(page.locator('tr[data-step="notify"] td.status')).to_have_text("skipped (not reached)")
        page.click('tr[data-step="charge"]')
        expect(page.locator("#panel-status")).to_have_text("failed")
        expect(page.locator("#panel-error")).to_contain_text("card declined " + HOSTILE)  # as text
        expect(page.locator("#panel-node")).to_contain_text('"tool": "explode"')  # what it was given
        expect(page.locator("#panel-attempts tr")).to_have_count(2)  # header + one attempt
        error = next(e for e in api.client.events("failing-1") if e.kind == "step_failed").payload["error"]
        assert "RuntimeError" in error["traceback"]  # journaled by the failure payload, shown in a <pre>
        expect(page.locator("#panel-traceback")).to_contain_text("RuntimeError")
        expect(page.locator("#panel-traceback")).to_contain_text("in explode")
        expect(page.locator('#dag g[data-node="charge"]')).to_have_class("dag-node state-failed")
        expect(page.locator('#dag g[data-node="notify"]')).to_have_class("dag-node state-not-reached")
        assert page.locator("#panel img").count() == 0 and page.locator("#panel script").count() == 0
        assert page.locator("#run-error img").count() == 0 and page.locator("#run-error script").count() == 0
        shoot(page, tmp_path, "failed-step-panel")


def test_a_cancelled_runs_page_says_who_cancelled_it_and_why(api: Api) -> None:
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "gate", "type": "approval", "data": {"prompt": "go?"}}],
             "edges": [{"source": "start", "target": "gate"}]}
    start(api, "cancel-1", graph)
    deadline = time.monotonic() + 30
    while api.client.get_run("cancel-1").status != "waiting":  # bounded: until it parks at the gate
        assert time.monotonic() < deadline
        time.sleep(0.1)
    api.client.cancel("cancel-1", reason="no longer needed " + HOSTILE, by="ops")
    with logged_in(api) as page:
        page.goto(api.url + "/runs/cancel-1")
        expect(page.locator("#status")).to_have_text("cancelled", timeout=30_000)
        expect(page.locator("#run-error")).to_have_text("cancelled by ops: no longer needed " + HOSTILE)
        assert page.locator("#run-error img").count() == 0


def test_approving_with_a_comment_after_reading_the_show_payload(api: Api, tmp_path: Path) -> None:
    graph = {"nodes": [
        {"id": "start", "type": "trigger"},
        {"id": "gate", "type": "approval", "data": {
            "prompt": "Refund {{ input.amount }} EUR to {{ input.customer }}?",
            "show": {"amount": "{{ input.amount }}", "customer": "{{ input.customer }}", "note": "{{ input.note }}"}}},
        {"id": "pay", "type": "tool", "data": {"tool": "echo", "args": {"paid": True}}}],
        "edges": [{"source": "start", "target": "gate"},
                  {"source": "gate", "target": "pay", "sourceHandle": "approved"}]}
    start(api, "approve-1", graph, {"amount": 42, "customer": "ada", "note": HOSTILE})
    with logged_in(api) as page:
        page.goto(api.url + "/runs/approve-1")
        card = page.locator("#approval-gate")
        expect(card).to_be_visible(timeout=30_000)
        [pending] = api.get("/v1/runs/approve-1/approvals").json()["approvals"]
        expect(card.locator(".approval-prompt")).to_have_text("Refund 42 EUR to ada?")
        expect(card.locator(".approval-show")).to_contain_text(json.dumps(HOSTILE))  # as JSON text, escaped
        expect(card.locator(".approval-show")).to_contain_text('"customer": "ada"')
        expect(card.locator(".approval-hash")).to_have_text(pending["approval_hash"])
        card.locator(".approval-comment").fill("checked the invoice, ok")
        card.locator('button[data-decision="reject"]').click()
        expect(page.locator("#confirm")).to_be_visible()
        page.click("#confirm-cancel")  # changed my mind: nothing is posted
        expect(page.locator("#confirm")).to_be_hidden()
        assert not [e for e in api.client.events("approve-1") if e.kind == "approval_decided"]
        card.locator('button[data-decision="approve"]').click()
        expect(page.locator("#confirm-comment")).to_have_text("checked the invoice, ok")
        expect(page.locator("#confirm-hash")).to_have_text(pending["approval_hash"])
        shoot(page, tmp_path, "approval-confirm")
        page.click("#confirm-yes")
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        decided = page.locator("#approval-gate .approval-decided")
        expect(decided).to_contain_text("approved by")
        expect(decided).to_contain_text("checked the invoice, ok")
        shoot(page, tmp_path, "approval-decided")
    [event] = [e for e in api.client.events("approve-1") if e.kind == "approval_decided"]
    assert event.payload["comment"] == "checked the invoice, ok" and event.payload["decision"] == "approved"
    assert event.payload["by"] in decided_text(api)


def decided_text(api: Api) -> str:
    step = api.get("/v1/runs/approve-1/steps/gate").json()
    return f"{step['approval']['decision']} by {step['approval']['by']}"


def test_the_waterfall_of_a_run_killed_mid_step_shows_two_attempts_and_the_recovery(
        api: Api, processes: Processes, tmp_path: Path) -> None:
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "slow", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 3}}},
                       {"id": "after", "type": "tool", "data": {"tool": "echo", "args": {"ok": True}}}],
             "edges": [{"source": "start", "target": "slow"}, {"source": "slow", "target": "after"}]}
    worker = next(p for p in processes.started if "worker" in p.args)
    start(api, "killed-1", graph)
    assert wait_until(lambda: any(e.kind == "step_started" and e.step_id == "slow"
                                  for e in api.client.events("killed-1")), timeout=60)
    os.kill(worker.pid, signal.SIGKILL)  # mid-step: the nap is running
    worker.wait(timeout=30)
    processes.worker("fresh")
    processes.beat()
    assert api.client.wait("killed-1", timeout=120).status == "succeeded"
    with logged_in(api) as page:
        page.goto(api.url + "/runs/killed-1")
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        row = page.locator('tr[data-step="slow"]')
        expect(row.locator(".bar.attempt")).to_have_count(2)
        expect(row.locator(".bar.attempt.lost")).to_have_count(1)
        expect(row.locator(".bar.attempt.completed")).to_have_count(1)
        expect(row.locator(".bar.dead")).to_have_count(1)
        expect(row.locator(".mark.recovery")).to_have_count(1)
        expect(page.locator('tr[data-step="after"] .bar.attempt')).to_have_count(1)
        row.click()
        attempts = page.locator("#panel-attempts tr")
        expect(attempts).to_have_count(3)  # header, the lost attempt, its re-run
        expect(attempts.nth(1)).to_contain_text("lost")
        expect(attempts.nth(2)).to_contain_text("completed")
        expect(page.locator("#panel-dead tr")).to_have_count(2)
        shoot(page, tmp_path, "killed-mid-step")
    [slow] = [r for r in api.get("/v1/runs/killed-1/waterfall").json()["rows"] if r["step_id"] == "slow"]
    lost, rerun = slow["bars"]
    assert rerun["generation"] > lost["generation"] and slow["dead"][0]["to"] <= rerun["started_at"]


def test_the_dag_view_colours_each_node_by_its_step_state(api: Api, tmp_path: Path) -> None:
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "check", "type": "condition", "data": {"expression": "{{ input.big }}"}},
                       {"id": "yes", "type": "tool", "data": {"tool": "echo", "args": {"big": True}}},
                       {"id": "no", "type": "tool", "data": {"tool": "echo", "args": {"big": False}}},
                       {"id": "no_more", "type": "tool", "data": {"tool": "echo", "args": {}}},
                       {"id": "gate", "type": "approval", "data": {"prompt": "Ship it?"}}],
             "edges": [{"source": "start", "target": "check"},
                       {"source": "check", "target": "yes", "sourceHandle": "true"},
                       {"source": "check", "target": "no", "sourceHandle": "false"},
                       {"source": "no", "target": "no_more"}, {"source": "yes", "target": "gate"}]}
    start(api, "dag-1", graph, {"big": True})
    with logged_in(api) as page:
        page.goto(api.url + "/runs/dag-1")
        expect(page.locator('#dag g[data-node="gate"]')).to_have_class("dag-node state-waiting", timeout=30_000)
        for node, state in (("start", "completed"), ("check", "completed"), ("yes", "completed"),
                            ("no", "skipped"), ("no_more", "skipped")):
            expect(page.locator(f'#dag g[data-node="{node}"]')).to_have_class(f"dag-node state-{state}")
        expect(page.locator("#dag .dag-handle")).to_have_count(2)  # the branches' labels
        expect(page.locator('tr[data-step="no"] td.status')).to_have_text("skipped (branch not taken)")
        page.click('#dag g[data-node="no"]')
        expect(page.locator("#panel-status")).to_have_text("skipped (branch not taken)")
        shoot(page, tmp_path, "dag")


def test_filtering_and_paging_the_runs_list(api: Api, tmp_path: Path) -> None:
    journal = api.client.runtime.journal
    for i in range(53):  # queued runs written straight to the journal: no worker needs to run them
        name = "refunds" if i % 2 else "reports"
        journal.runs.create_run(run_id=f"bulk-{i:02d}", tenant_id="acme", kind="graph",
                                graph={"name": name, "nodes": []}, graph_hash=None, run_input=None,
                                now=utcnow(), lease_ttl=600)
    journal.runs.create_run(run_id="theirs-1", tenant_id="globex", kind="graph", graph={"name": "refunds"},
                            graph_hash=None, run_input=None, now=utcnow(), lease_ttl=600)
    journal.runs.create_run(run_id="nameless-1", tenant_id="acme", kind="graph", graph={"nodes": []},
                            graph_hash="ab12cd34ef56ab12cd34", run_input=None, now=utcnow(), lease_ttl=600)
    with logged_in(api) as page:
        page.goto(api.url + "/runs")
        expect(page.locator("#runs tr[data-run]")).to_have_count(50)
        # A graph without a name is said to be one, with the start of its hash, not a blank cell.
        expect(page.locator('#runs tr[data-run="nameless-1"] .graph-name')).to_have_text("unnamed ab12cd34ef56")
        expect(page.locator("#page-number")).to_have_text("page 1")
        page.click("#page-older")
        expect(page.locator("#runs tr[data-run]")).to_have_count(4)
        expect(page.locator("#runs")).to_contain_text("bulk-00")
        page.fill("#f-graph", "refunds")
        page.fill("#f-search", "BULK-1")
        page.click("#f-apply")
        rows = page.locator("#runs tr[data-run]")
        expect(rows).to_have_count(5)  # bulk-11, 13, 15, 17, 19
        expect(page.locator("#runs .graph-name").first).to_have_text("refunds")
        expect(page.locator("#runs")).not_to_contain_text("theirs-1")
        shoot(page, tmp_path, "runs-filtered")
        page.fill("#f-since", "yesterday")
        page.click("#f-apply")
        expect(page.locator("#filter-error")).to_contain_text("ISO 8601")
        page.goto(api.url + "/runs?search=" + "x" * 300)
        expect(page.locator("#filter-error")).to_contain_text("longer than")
        page.goto(api.url + "/runs?status=queued&until=2000-01-01")
        expect(page.locator("#no-runs")).to_have_text("no runs match")
