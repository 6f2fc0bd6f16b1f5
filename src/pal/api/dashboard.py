"""The dashboard: server-rendered pages over the same tokens as /v1 (a login form sets them as an
HttpOnly, SameSite=Strict cookie), a run list (filters, pages) and the run page: the live
waterfall, the step panel, the run's DAG and its approvals (small vanilla JS, docs/api.md, "The dashboard").

Every page is a Jinja template with autoescaping on, so nothing a request or the journal holds is
ever emitted as markup; the pages' script and styles are static files, as the strict CSP of
pal.api.headers requires. Every form POST passes the CSRF checks of pal.api.csrf."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from pal.api import csrf
from pal.api.auth import COOKIE, tenant_of
from pal.api.deps import Rt
from pal.core.records import RunRecord
from pal.core.run_filters import MAX_OFFSET, run_filter
from pal.core.vocabulary import ALL_STATUSES
from pal.errors import RunNotFound

HERE = Path(__file__).parent
# autoescape=True, not select_autoescape: every template is HTML, whatever its file name.
_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
RUNS_PER_PAGE = 50
FILTER_FIELDS = ("status", "graph", "search", "since", "until")
MAX_FIELD_CHARS = 256  # longer than any valid filter: the validator names what is too long

# Pages for a browser, not API operations: none is in the OpenAPI schema.
router = APIRouter(include_in_schema=False)


def add_dashboard(api: FastAPI) -> None:
    """The dashboard's pages and their static files on `api`. The static files are mounted on the
    app itself: include_router carries routes only, and would drop a router's mount."""
    api.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    api.include_router(router)


def _page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    # no-store: the pages carry the session's CSRF token; no cache should keep a copy.
    return HTMLResponse(_templates.get_template(name).render(**context), status_code=status_code,
                        headers={"Cache-Control": "no-store"})


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (its size is capped by pal.api.limits.BodyLimit)."""
    fields = parse_qs((await request.body()).decode(errors="replace"))
    return {name: values[0] for name, values in fields.items()}


def _session(request: Request) -> tuple[str, str] | None:
    """(tenant, CSRF token) of the dashboard cookie's live token, None when logged out."""
    token = request.cookies.get(COOKIE)
    who = tenant_of(request, token) if token else None
    return (who, csrf.session_token(token)) if who is not None and token else None


def _login_page(request: Request, error: str | None = None, status_code: int = 200) -> HTMLResponse:
    value = request.cookies.get(csrf.LOGIN_COOKIE) or secrets.token_urlsafe(32)
    page = _page("login.html", status_code, error=error, csrf=value)
    page.set_cookie(csrf.LOGIN_COOKIE, value, httponly=True, samesite="strict", path="/login",
                    secure=request.url.scheme == "https")
    return page


@router.get("/")
def home() -> Response:
    return RedirectResponse("/runs", status_code=303)


@router.get("/login")
def login_form(request: Request) -> HTMLResponse:
    return _login_page(request)


@router.post("/login")
async def login(request: Request) -> Response:
    fields = await _form(request)
    try:  # login CSRF: a foreign page must not log the browser in as someone else
        csrf.require_same_origin(request, fields.get(csrf.FORM_FIELD),
                                 request.cookies.get(csrf.LOGIN_COOKIE))
    except HTTPException:
        return _login_page(request, "The login form expired or came from another site; try again.", 403)
    token = fields.get("token", "").strip()
    if not token or tenant_of(request, token) is None:
        return _login_page(request, "That token is unknown or revoked.", 401)
    reply = RedirectResponse("/runs", status_code=303)
    reply.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                     secure=request.url.scheme == "https")
    reply.delete_cookie(csrf.LOGIN_COOKIE, path="/login")
    return reply


@router.get("/logout")
def logout_form(request: Request) -> Response:
    """Logging out changes state, so it is a POST; GET only shows the button."""
    who = _session(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    return _page("logout.html", tenant=who[0], csrf=who[1])


@router.post("/logout")
async def logout(request: Request) -> Response:
    token = request.cookies.get(COOKIE)
    if token:
        fields = await _form(request)
        csrf.require_same_origin(request, fields.get(csrf.FORM_FIELD), csrf.session_token(token))
    reply = RedirectResponse("/login", status_code=303)
    reply.delete_cookie(COOKIE)
    return reply


@router.get("/runs")
def runs_page(request: Request, rt: Rt) -> Response:
    """The tenant's runs, newest first, a page at a time, filtered as GET /v1/runs is (the form's
    fields are its query parameters; a bad one is named on the page, a 400)."""
    who = _session(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    asked = {key: request.query_params.get(key, "")[:MAX_FIELD_CHARS] for key in FILTER_FIELDS}
    page = _page_number(request.query_params.get("page", "1"))
    try:
        chosen = run_filter(**asked)
    except ValueError as exc:
        return _page("runs.html", 400, tenant=who[0], csrf=who[1], runs=[], asked=asked, error=str(exc),
                     statuses=ALL_STATUSES, page=1, links={})
    found = rt.control.list_runs(tenant_id=who[0], limit=RUNS_PER_PAGE + 1, offset=(page - 1) * RUNS_PER_PAGE,
                                 **chosen.as_kwargs())
    query = chosen.as_query()
    links = {name: "/runs?" + urlencode(query | {"page": str(number)}) for name, number in (
        ("first", 1), ("newer", page - 1), ("older", page + 1))
        if number >= 1 and number != page and (name != "older" or len(found) > RUNS_PER_PAGE)}
    return _page("runs.html", tenant=who[0], csrf=who[1], runs=found[:RUNS_PER_PAGE], asked=asked,
                 error=None, statuses=ALL_STATUSES, page=page, links=links)


def _page_number(text: str) -> int:
    """A page number from the query, 1 when it is not one; capped so the offset stays bounded."""
    number = int(text) if text.isdigit() and len(text) <= 6 else 1
    return max(1, min(number, MAX_OFFSET // RUNS_PER_PAGE))


@router.get("/runs/{run_id}")
def run_page(run_id: str, request: Request, rt: Rt) -> Response:
    who = _session(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    try:
        run = rt.control.get_run(run_id, tenant_id=who[0])
    except RunNotFound:
        return _page("missing.html", 404, tenant=who[0], csrf=who[1], run_id=run_id)
    return _page("run.html", tenant=who[0], csrf=who[1], run=run, receipts=bool(rt.settings.signing_key),
                 derived=rt.control.derived_runs(run.id), fork_steps=_fork_steps(run))


def _fork_steps(run: RunRecord) -> list[str]:
    """The node ids a fork of `run` may start from (docs/retry-and-fork.md): a top-level graph
    run's nodes; none for a child run, a plain-LLM or a microVM run, which are not forked."""
    if run.kind != "graph" or run.parent_run_id is not None or not isinstance(run.graph, dict):
        return []
    return [str(node.get("id")) for node in run.graph.get("nodes", []) if isinstance(node, dict)]
