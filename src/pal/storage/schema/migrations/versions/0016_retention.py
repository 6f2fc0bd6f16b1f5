"""Retention (`pal runs prune`, docs/retention.md): `pruned_runs` (a pruned run's id stays taken;
its kept receipt), and the indexes the prune walks by: finished top-level runs by finish time, and
child runs by parent.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_FINISHED_TOP = sa.text("parent_run_id IS NULL AND finished_at IS NOT NULL")
_CHILD = sa.text("parent_run_id IS NOT NULL")


def upgrade() -> None:
    op.create_table(
        "pruned_runs",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("pruned_at", UtcDateTime(), nullable=False),
        sa.Column("receipt", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name="pk_pruned_runs"),
    )
    op.create_index("ix_runs_finished", "runs", ["finished_at", "id"], postgresql_where=_FINISHED_TOP,
                    sqlite_where=_FINISHED_TOP)
    op.create_index("ix_runs_parent_run_id", "runs", ["parent_run_id"], postgresql_where=_CHILD,
                    sqlite_where=_CHILD)


def downgrade() -> None:
    op.drop_index("ix_runs_parent_run_id", table_name="runs")
    op.drop_index("ix_runs_finished", table_name="runs")
    op.drop_table("pruned_runs")
