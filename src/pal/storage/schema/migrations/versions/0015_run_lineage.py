"""Run lineage: the run a run retries or forks (`runs.source_run_id`, `source_kind`,
`source_step_id`), docs/retry-and-fork.md.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_DERIVED = sa.text("source_run_id IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("source_run_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("source_kind", sa.String(16), nullable=True))
        batch.add_column(sa.Column("source_step_id", sa.String(256), nullable=True))
        batch.create_check_constraint("ck_runs_source_kind",
                                      "source_kind IS NULL OR source_kind IN ('retry', 'fork')")
    op.create_index("ix_runs_source_run_id", "runs", ["source_run_id"], postgresql_where=_DERIVED,
                    sqlite_where=_DERIVED)


def downgrade() -> None:
    op.drop_index("ix_runs_source_run_id", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_source_kind", type_="check")
        batch.drop_column("source_step_id")
        batch.drop_column("source_kind")
        batch.drop_column("source_run_id")
