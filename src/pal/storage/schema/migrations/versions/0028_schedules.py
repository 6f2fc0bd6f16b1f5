"""`schedules`: a tenant's cron schedules and the next tick each is due (docs/schedules.md).

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime, json_type

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("graph", json_type(), nullable=False),
        sa.Column("input", json_type(), nullable=True),
        sa.Column("overlap", sa.String(8), nullable=False),
        sa.Column("catch_up", sa.Boolean(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_at", UtcDateTime(), nullable=False),
        sa.Column("last_run_id", sa.String(128), nullable=True),
        sa.Column("last_fired_at", UtcDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "name", name="pk_schedules"),
    )
    op.create_index("ix_schedules_due", "schedules", ["next_at"])


def downgrade() -> None:
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_table("schedules")
