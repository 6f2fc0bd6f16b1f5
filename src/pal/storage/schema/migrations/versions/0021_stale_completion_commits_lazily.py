"""Postgres only: a one-call completion that finds its caller's log stale commits without waiting
for its WAL flush.

`pal_complete_step_then` appends `step_completed` only when no step event came after the caller's
log; otherwise it writes nothing but the lease's renewal, and the caller decides again in a
transaction. That renewal needs no durable commit, as a claim's does not: a later durable commit
flushes it, and losing it only shortens the lease. Before, each such call waited for a WAL flush
of a renewal that a crash may lose harmlessly; a fan-out's branches, completing side by side, met
it often once their completions that hand off nothing became one call too (docs/architecture.md,
"The step protocol"). Loads pal/storage/sql/functions.sql as migration 0009 explains.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

SQL_SHA256 = "b90478ec17a50d29c1bac009ad0e6b292709085ee8ad5172e0d6b6203411cbc8"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the definition of 0020 differs only in how a stale call commits
