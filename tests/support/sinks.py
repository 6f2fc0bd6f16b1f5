"""Everything a run leaves behind that a secret could leak into, as text to search: every row of every
table of the test's Postgres schema, the REST answers about the run (SSE included) and its steps, and
the processes' logs. Used by tests/e2e/test_secret_handoffs.py (docs/security.md, "Secrets")."""

from __future__ import annotations

from pathlib import Path

import httpx
import sqlalchemy as sa

from pal.cli.demo import wait_until
from pal.client import Client
from pal.storage.database import create_engine
from tests.support import web

_TABLES = ("select table_name from information_schema.tables "
           "where table_schema = current_schema() and table_type = 'BASE TABLE' order by table_name")


def database_rows(database_url: str) -> dict[str, str]:
    """{table: its rows as text}: each row cast whole to text, so every column is in it, whatever
    the table (a table added later is searched too)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            tables = list(conn.execute(sa.text(_TABLES)).scalars())
            assert "runs" in tables and "journal_events" in tables, tables  # the right schema
            return {f"table {table}": "\n".join(conn.execute(sa.text(f'select t::text from "{table}" t')).scalars())
                    for table in tables}
    finally:
        engine.dispose()


def run_answers(api: str, token: str, client: Client, run_id: str) -> dict[str, str]:
    """{route: body} of every GET a tenant may make about `run_id`: the run, its journal, waterfall,
    SSE stream, signed receipt, approvals and each of its steps (input, output, receipts)."""
    auth = {"Authorization": f"Bearer {token}"}
    answers: dict[str, str] = {}
    steps = sorted({e.step_id for e in client.events(run_id) if e.step_id})
    routes = ["", "/journal", "/waterfall", "/events", "/receipt", "/approvals", *(f"/steps/{s}" for s in steps)]
    for route in routes:
        reply = web.get(f"{api}/v1/runs/{run_id}{route}", headers=auth, timeout=30)
        assert reply.status_code == 200, (run_id, route, reply.text)
        answers[f"GET /v1/runs/{run_id}{route or '/'}"] = reply.text
    return answers


def logs(folder: Path) -> dict[str, str]:
    return {f"log {path.name}": path.read_text(errors="replace") for path in sorted(folder.glob("*.log"))}


def api_is_up(api: str) -> bool:
    try:
        return web.get(api + "/openapi.json", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_for_api(api: str) -> None:
    assert wait_until(lambda: api_is_up(api), timeout=60)


def leaks(value: str, sinks: dict[str, str]) -> list[str]:
    """The sinks whose text holds `value`."""
    return [name for name, text in sinks.items() if value in text]
