"""`run_signals`: signals sent to a run, kept until a `wait_event` step takes one (docs/nodes.md,
"wait_event"). A signal sent before its wait waits for it; the step attempt that took it is named.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime, json_type

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_signals",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("payload", json_type(), nullable=True),
        sa.Column("sent_by", sa.String(256), nullable=False),
        sa.Column("sent_at", UtcDateTime(), nullable=False),
        sa.Column("taken_step", sa.String(256), nullable=True),
        sa.Column("taken_attempt", sa.Integer(), nullable=True),
        sa.Column("taken_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_run_signals"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_signals_run_id", ondelete="CASCADE"),
    )
    op.create_index("ix_run_signals_run_name", "run_signals", ["run_id", "name", "sent_at"])


def downgrade() -> None:
    op.drop_index("ix_run_signals_run_name", table_name="run_signals")
    op.drop_table("run_signals")
