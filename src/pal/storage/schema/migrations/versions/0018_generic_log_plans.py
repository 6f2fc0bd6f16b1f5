"""Postgres only: the functions read the step log by `run_id = $run AND seq > $after` again, with a
plan made once for any run (`plan_cache_mode` force_generic_plan on each function that reads it).

Migration 0017's row comparison, `(run_id, seq) > ($run, $after)` beside `run_id = $run`, kept the
planner off the primary key on `seq`, but the index scan then started at the run's first event:
every claim and completion read the whole run's index entries, so a step cost grew with the run
(docs/decisions/step-log-cache.md). A generic plan estimates `run_id = $run` from the column's
distinct values and always walks `ix_journal_events_run_seq` from ($run, $after). Loads
pal/storage/sql/functions.sql as migration 0009 explains.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

SQL_SHA256 = "eb5d24b8eb9f62b3dc30270c01bd2fda3a98827b2031cb734b766e9b69203268"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the same functions, reading the same rows: nothing to undo
