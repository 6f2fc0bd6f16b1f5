"""Postgres only: the functions' step-log reads compare (run_id, seq) as a row.

`run_id = $run AND seq > $after` let the planner scan the primary key on `seq` and filter by run
when it estimated one row either way (the statistics' histogram ends below the newest events),
which reads every other run's events written since `$after`. `(run_id, seq) > ($run, $after)` can
only be served by `ix_journal_events_run_seq` (docs/decisions/step-log-cache.md). Loads
pal/storage/sql/functions.sql as migration 0009 explains.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

SQL_SHA256 = "69687a14443c1eaa1d66587ebe0aafbb5ca5dea480475e4fbc7cb1078a8d58a8"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the same functions, reading the same rows: nothing to undo
