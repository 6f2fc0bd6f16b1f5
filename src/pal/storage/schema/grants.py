"""Least privilege for PAL's processes: what a worker, beat or the API needs of the journal's schema,
granted to a database role that owns nothing (`pal db grant ROLE`).

The migrations run as the schema's owner; every other process can connect as a role that may only
read and append the journal (never update or delete an event: the history cannot be rewritten
through it), update runs, leases and receipts, and call the step functions. docs/security.md.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.errors import ConfigError
from pal.storage.sql.queries import query

# table -> privileges. journal_events: read and append only.
TABLE_PRIVILEGES = {
    "runs": "SELECT, INSERT, UPDATE",
    "journal_events": "SELECT, INSERT",
    "run_locks": "SELECT, INSERT, UPDATE, DELETE",
    "side_effect_receipts": "SELECT, INSERT, UPDATE",
    "api_tokens": "SELECT, INSERT, UPDATE",
    "pal_keys": "SELECT",
    "run_anomalies": "SELECT, INSERT",  # an anomaly is journaled once, never changed
    "step_baselines": "SELECT, INSERT, DELETE",  # beat rewrites them; workers read them
    "runtime_vms": "SELECT, INSERT, UPDATE",  # the isolated tier's VMs (docs/isolated-tier.md)
    "pruned_runs": "SELECT",  # pruned ids stay taken; kept receipts (docs/retention.md)
    "run_signals": "SELECT, INSERT, UPDATE",  # sent, then taken once by a waiting step
    "run_start_keys": "SELECT, INSERT, UPDATE",  # a dedupe or debounce key moves to a newer run
    "tenant_admission": "SELECT, INSERT, UPDATE",  # a lock row per tenant: admissions queue on it
    "schedules": "SELECT, INSERT, UPDATE, DELETE",  # pal schedules add|pause|resume|delete, beat's ticks
}
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")


def _check_role(role: str) -> None:
    if not _ROLE.match(role):
        raise ConfigError(f"role {role!r} must be a plain lowercase Postgres name ([a-z_][a-z0-9_]*)")


def grant_statements(role: str, schema: str) -> list[str]:
    _check_role(role)
    quoted = f'"{schema}"'
    statements = [f"GRANT USAGE ON SCHEMA {quoted} TO {role}"]
    statements += [f"GRANT {privileges} ON {quoted}.{table} TO {role}"
                   for table, privileges in TABLE_PRIVILEGES.items()]
    statements += [f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {quoted} TO {role}",
                   f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {quoted} TO {role}"]
    return statements


def grant_app_role(engine: Engine, role: str) -> list[str]:
    """Grant `role` what PAL's processes need on the journal's schema (Postgres; the role must exist).
    Returns the statements it ran."""
    _check_role(role)
    if engine.dialect.name != "postgresql":
        raise ConfigError("database roles are a Postgres feature; the embedded SQLite journal has none")
    with engine.begin() as conn:
        schema = conn.exec_driver_sql(query("current_schema").driver_sql, ()).scalar_one()
        exists = conn.exec_driver_sql(query("role_exists").driver_sql, (role,)).first()
        if exists is None:
            raise ConfigError(f"there is no database role {role!r}; create it first "
                              f"(CREATE ROLE {role} LOGIN PASSWORD '…')")
        statements = grant_statements(role, schema)
        for statement in statements:
            conn.execute(sa.text(statement))
    return statements
