"""Postgres only: `pal_complete_step_then`, the one-call completion that may also start the one
successor its caller will run itself.

A solo worker that publishes a step's only successor takes that message straight back (pal.workers
.inline), so it is the successor's worker before the completion commits. Its claim used to be one
more statement after the completion; now the completion's transaction appends the successor's
`step_started` after the `step_completed` it follows, and the worker's claim of that message needs
no statement (docs/architecture.md, "The life of one step"). `pal_complete_step` stays, as that
completion starting nothing, for workers that predate this migration during a rolling upgrade.
Loads pal/storage/sql/functions.sql as migration 0009 explains.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SQL_SHA256 = "abf66693c3f87ae75a89c9527b793cc87fd0d20fbce04c66a69f19392d1a28b1"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # pal_complete_step keeps its meaning for older code; pal_complete_step_then is left unused
