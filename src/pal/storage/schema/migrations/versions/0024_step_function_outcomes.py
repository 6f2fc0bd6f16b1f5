"""Postgres only: the step functions answer a typed outcome instead of marker rows.

Each step function now returns one row, an `outcome` word beside the events it read, where before
an outcome came as a row with a negative `seq` among the events. The lease fence and the list of
step-log kinds each live in one helper (`pal_fence`, `pal_step_log`) that the others call, as does
the once-only append of `step_started` and `step_completed` (`pal_append_once`). The
functions get new names, since a function's result type cannot be replaced in place; the old ones
are dropped. Workers of an older PAL fail their one-call claims from here on (a StorageError, the
step re-driven after its lease): upgrade the workers with the database. Loads
pal/storage/sql/functions.sql as migration 0009 explains (docs/decisions/sql-step-functions.md).

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

SQL_SHA256 = "75af167b0f30d1493035710933e77854d49c49b5da4502085f786678ee782b7c"

_RETIRED = (
    "pal_claim_fence(text, integer, text, timestamptz, bigint)",
    "pal_complete_fence(text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz)",
    "pal_claim_step(text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz, boolean)",
    "pal_claim_step_after(text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz, "
    "boolean, text[])",
    "pal_complete_step(text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz)",
    "pal_complete_step_then(text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz, "
    "text, integer, jsonb)",
    "pal_read_log(text, integer, bigint)",
    "pal_start_step(text, text, integer, integer, jsonb, timestamptz)",
)


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for signature in _RETIRED:
            op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    load_functions(op.execute, dialect)


def downgrade() -> None:
    raise NotImplementedError("0024 retired the marker-row step functions; restore a backup to go back")
