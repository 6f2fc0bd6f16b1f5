"""The dashboard: server-rendered pages over the same tokens as /v1 (a login form sets them as an
HttpOnly, SameSite=Strict cookie), a run list and the live run waterfall (small vanilla JS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from pal.api.auth import COOKIE, presented_token, tenant_of
from pal.errors import RunNotFound
from pal.runtime import Runtime

HERE = Path(__file__).parent
_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                autoescape=jinja2.select_autoescape(["html"]))
RUNS_PER_PAGE = 100


def _page(name: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**context))


def add_dashboard(api: FastAPI, rt: Runtime) -> None:
    api.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def tenant(request: Request) -> str | None:
        token = request.cookies.get(COOKIE)
        return tenant_of(request, token) if token else None

    @api.get("/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse("/runs", status_code=303)

    @api.get("/login", include_in_schema=False)
    def login_form() -> HTMLResponse:
        return _page("login.html", error=None)

    @api.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = parse_qs((await request.body()).decode(errors="replace"))
        token = (fields.get("token") or [""])[0].strip()
        if not token or tenant_of(request, token) is None:
            page = _page("login.html", error="That token is unknown or revoked.")
            page.status_code = 401
            return page
        reply = RedirectResponse("/runs", status_code=303)
        reply.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                         secure=request.url.scheme == "https")
        return reply

    @api.get("/logout", include_in_schema=False)
    def logout() -> Response:
        reply = RedirectResponse("/login", status_code=303)
        reply.delete_cookie(COOKIE)
        return reply

    @api.get("/runs", include_in_schema=False)
    def runs_page(request: Request) -> Response:
        who = tenant(request)
        if who is None:
            return RedirectResponse("/login", status_code=303)
        return _page("runs.html", tenant=who, runs=rt.journal.list_runs(tenant_id=who, limit=RUNS_PER_PAGE))

    @api.get("/runs/{run_id}", include_in_schema=False)
    def run_page(run_id: str, request: Request) -> Response:
        who = tenant(request)
        if who is None:
            return RedirectResponse("/login", status_code=303)
        try:
            run = rt.journal.get_run(run_id, tenant_id=who)
        except RunNotFound:
            return HTMLResponse(f"no run {run_id!r}", status_code=404)
        return _page("run.html", tenant=who, run=run)


__all__ = ["add_dashboard", "presented_token"]
