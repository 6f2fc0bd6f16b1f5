"""The dashboard's defences against a real `pal api` and `pal worker`: in real headless Chromium
(Playwright driving /usr/bin/chromium) it works under its strict CSP with no violation and runs no
injected script; over HTTP, no cookie-authenticated change passes without its origin and CSRF token,
and logging out takes a POST."""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import Dialog, expect, sync_playwright

from pal.cli.demo import wait_until
from pal.core.clock import utcnow
from tests.e2e.test_api_security import gated
from tests.e2e.test_dashboard import CHROMIUM_FLAGS
from tests.support import web
from tests.support.api_server import Api, free_port

HOSTILE_TENANT = "<img src=x onerror=alert('tenant')>"
WATCH_CSP = """window.palCsp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  const text = `${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`;
  window.palCsp.push(text);
  window.palCspViolation(text);
});"""


def test_the_dashboard_works_under_its_csp_and_runs_no_injected_script(api: Api) -> None:
    _, token = api.client.runtime.journal.tokens.create_token(tenant_id=HOSTILE_TENANT, name="csp", now=utcnow())
    violations: list[str] = []
    console: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        context = browser.new_context()
        context.expose_function("palCspViolation", lambda text: violations.append(text))
        context.add_init_script(WATCH_CSP)
        page = context.new_page()
        page.on("console", lambda message: console.append(message.text))
        def on_dialog(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)

        def log_in() -> None:
            page.goto(api.url + "/runs")
            expect(page).to_have_url(api.url + "/login")
            page.fill("#token", token)
            page.click("#login")  # a same-origin form POST: its hidden CSRF field lets it through
            expect(page).to_have_url(api.url + "/runs")

        log_in()
        expect(page.locator("header")).to_contain_text(HOSTILE_TENANT)  # as text, not markup
        caller = {"Authorization": f"Bearer {token}"}
        reply = api.call("POST", "/v1/runs", token, json={"graph": gated(), "run_id": "csp-1"})
        assert reply.status_code == 201
        page.goto(api.url + "/runs/csp-1")
        expect(page.locator('tr[data-step="gate"] td.status')).to_have_text("waiting", timeout=30_000)
        # The stylesheet applies and the script positions bars through CSSOM, not style="".
        bar = page.locator('tr[data-step="gate"] .bar.wait')
        expect(bar).to_have_css("background-color", "rgb(240, 163, 60)")
        assert page.eval_on_selector('tr[data-step="gate"] .bar.wait', "e => e.style.width").endswith("%")
        page.fill("#approval-gate .approval-comment", "from the dashboard")
        page.click('#approval-gate button[data-decision="approve"]')
        page.click("#confirm-yes")  # fetch() with X-CSRF-Token
        expect(page.locator("#status")).to_have_text("succeeded", timeout=30_000)
        decided = [e for e in api.client.events("csp-1") if e.kind == "approval_decided"]
        assert len(decided) == 1 and decided[0].payload["comment"] == "from the dashboard"

        page.goto(api.url + "/runs/%3Cscript%3Ealert(1)%3C%5Cscript%3E%3Csvg%20onload=alert(1)%3E")
        expect(page.locator("#missing")).to_have_text("<script>alert(1)<\\script><svg onload=alert(1)>")
        page.goto(api.url + "/runs/%3Cimg%20src=x%20onerror=alert(2)%3E")
        expect(page.locator("#missing")).to_have_text("<img src=x onerror=alert(2)>")

        page.goto(api.url + "/logout")  # GET: only a page with the button; still logged in
        expect(page.locator("#confirm-logout")).to_be_visible()
        assert "pal_token" in {c["name"] for c in context.cookies()}
        page.click("#confirm-logout")
        expect(page).to_have_url(api.url + "/login")
        assert "pal_token" not in {c["name"] for c in context.cookies()}
        log_in()
        page.click("#logout")  # the header's button
        expect(page).to_have_url(api.url + "/login")
        assert "pal_token" not in {c["name"] for c in context.cookies()}
        assert violations == [], violations
        # The control: an injected handler is refused, and that refusal is seen by the listener.
        page.evaluate("""document.body.insertAdjacentHTML("beforeend",
                         '<img src="/nope.png" onerror="window.ran = 1; alert(3)">')""")
        page.wait_for_function("() => window.palCsp.length > 0")
        assert page.evaluate("window.ran") is None
        browser.close()
    assert len(violations) == 1 and violations[0].startswith("script-src-attr"), violations
    assert len([m for m in console if "Content Security Policy" in m or "Refused to" in m]) == 1, console
    assert dialogs == []
    assert web.get(api.url + "/v1/runs/csp-1", headers=caller, timeout=10).json()["status"] == "succeeded"


def csrf_of(api: Api) -> str:
    page = web.get(api.url + "/runs", cookies={"pal_token": api.token}, timeout=10)
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]{64})">', page.text)
    assert found is not None, page.text
    return found[1]


def test_no_cookie_authenticated_change_passes_without_its_origin_and_token(api: Api) -> None:
    assert api.post("/v1/runs", json={"graph": gated(), "run_id": "csrf-1"}).status_code == 201
    assert wait_until(lambda: api.get("/v1/runs/csrf-1").json()["status"] == "waiting", timeout=60)
    token = csrf_of(api)
    here = api.url
    neighbour = f"http://127.0.0.1:{free_port()}"  # same site, another origin: SameSite lets it through
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    attempts: list[dict[str, str]] = [
        form | {"Origin": "http://evil.example"}, form | {"Origin": neighbour}, form,
        form | {"Origin": "null"}, {"Origin": "http://evil.example", "X-CSRF-Token": token},
        {"Origin": neighbour, "X-CSRF-Token": token}, {"Sec-Fetch-Site": "same-site", "X-CSRF-Token": token},
        {"Referer": "http://evil.example/page", "X-CSRF-Token": token}, {"Origin": here, "X-CSRF-Token": "0" * 64},
        {"Origin": here}, {"Origin": here.replace("127.0.0.1", "localhost"), "X-CSRF-Token": token},
    ]
    routes = ["/v1/runs/csrf-1/steps/gate/approve", "/v1/runs/csrf-1/steps/gate/reject", "/v1/runs/csrf-1/cancel",
              "/v1/runs/csrf-1/resume", "/v1/runs"]
    for headers in attempts:
        for route in routes:
            body: dict[str, Any] = {"content": b"comment=forged"} if "Content-Type" in headers else {
                "json": {"graph": gated(), "run_id": "forged"} if route == "/v1/runs" else {"comment": "forged"}}
            reply = web.post(here + route, headers=headers, cookies={"pal_token": api.token}, timeout=10, **body)
            assert reply.status_code == 403, (headers, route, reply.status_code, reply.text)
    assert api.get("/v1/runs/csrf-1").json()["status"] == "waiting"  # nothing changed
    assert not [e for e in api.client.events("csrf-1") if e.kind == "approval_decided"]
    assert api.get("/v1/runs/forged").status_code == 404
    # The same cookie with this origin and the page's token is the dashboard's own request.
    ok = web.post(here + "/v1/runs/csrf-1/steps/gate/approve", json={"comment": "mine"}, timeout=10,
                    headers={"Origin": here, "X-CSRF-Token": token}, cookies={"pal_token": api.token})
    assert ok.status_code == 200, ok.text
    # The worker finishes the approved run (a cancel racing it would be accepted, not refused).
    assert wait_until(lambda: api.get("/v1/runs/csrf-1").json()["status"] == "succeeded", timeout=60)
    # A bearer header is no ambient credential (a foreign page cannot set it): no CSRF check applies,
    # and the request reaches the cancel itself, which refuses a finished run.
    assert api.post("/v1/runs/csrf-1/cancel", headers={"Origin": "http://evil.example"}).status_code == 409


def test_login_needs_its_form_and_logout_needs_a_post_from_this_origin(api: Api) -> None:
    here = api.url
    with httpx.Client(base_url=here, timeout=10) as browser:
        form = browser.get("/login")
        field = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert field is not None and browser.cookies.get("pal_login_csrf") == field[1]
        fields = {"csrf": field[1], "token": api.token}
        for headers, data in (({"Origin": "http://evil.example"}, fields), ({"Origin": here}, {"token": api.token}),
                              ({"Origin": here}, fields | {"csrf": "guess"})):
            refused = browser.post("/login", data=data, headers=headers)
            assert refused.status_code == 403 and "pal_token" not in browser.cookies, refused.text
        assert browser.post("/login", data=fields, headers={"Origin": "null"}).status_code == 303
        assert browser.cookies.get("pal_token") == api.token

    cookie = {"pal_token": api.token}
    token = csrf_of(api)
    shown = web.get(here + "/logout", cookies=cookie, timeout=10)  # GET: a page with a button
    assert shown.status_code == 200 and "set-cookie" not in shown.headers and 'id="confirm-logout"' in shown.text
    for headers, data in (({"Origin": "http://evil.example"}, {"csrf": token}), ({}, {}),
                          ({"Origin": here}, {"csrf": "0" * 64})):
        refused = web.post(here + "/logout", data=data, headers=headers, cookies=cookie, timeout=10)
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
    assert web.get(here + "/runs", cookies=cookie, timeout=10).status_code == 200  # still logged in
    done = web.post(here + "/logout", data={"csrf": token}, headers={"Origin": "null"}, cookies=cookie,
                      timeout=10)
    assert done.status_code == 303 and done.headers["location"] == "/login"
    assert 'pal_token=""' in done.headers["set-cookie"] and "Max-Age=0" in done.headers["set-cookie"]
