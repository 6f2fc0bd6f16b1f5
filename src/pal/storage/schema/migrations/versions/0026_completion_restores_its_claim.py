"""Postgres only: a completion writes back its step's claim when the claim is missing.

A claim (`step_started`) commits without waiting for its WAL flush (docs/guarantees.md, "Durable
commits"). When Postgres crashes, or fails over to a standby, before that claim reaches disk or the
standby, while the worker that made it goes on, the step's completion arrived with no
`step_started` before it. `pal_restore_start` (called by `pal_fenced_completion` and
`pal_complete`) writes it back, marked `restored`, in the completion's own durable transaction.
Loads pal/storage/sql/functions.sql as migration 0009 explains.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

SQL_SHA256 = "a902183a89b4312933fb5b0738d93c2a3a98b6cdf9540d4e25edcb4b296238d2"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # 0025's definitions differ only in writing no missing claim back
