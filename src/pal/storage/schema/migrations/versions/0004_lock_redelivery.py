"""run_locks.redeliver_at: when the sweep re-sends the messages of a recovery that no worker has
claimed yet (they may have been lost), instead of waiting out the 10-minute recovery lease.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_locks") as batch:
        batch.add_column(sa.Column("redeliver_at", UtcDateTime(), nullable=True))
    op.create_index("ix_run_locks_redeliver_at", "run_locks", ["redeliver_at"],
                    postgresql_where=sa.text("redeliver_at IS NOT NULL"),
                    sqlite_where=sa.text("redeliver_at IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_run_locks_redeliver_at", table_name="run_locks")
    with op.batch_alter_table("run_locks") as batch:
        batch.drop_column("redeliver_at")
