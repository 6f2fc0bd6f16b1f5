"""Admission (docs/fairness.md): a run's priority, its graph's rendered concurrency key and whether it
holds a slot or waits for one; `tenant_admission`, the row each tenant's admissions queue on.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("priority", sa.SmallInteger(), nullable=True))
        batch.add_column(sa.Column("concurrency_key", sa.String(256), nullable=True))
        batch.add_column(sa.Column("admitted", sa.Boolean(), nullable=True))
    admitted, held = sa.column("admitted").is_(True), sa.column("admitted").is_(False)
    op.create_index("ix_runs_admitted", "runs", ["tenant_id", "concurrency_key"],
                    postgresql_where=admitted, sqlite_where=admitted)
    op.create_index("ix_runs_held", "runs", ["tenant_id", "priority", "created_at", "id"],
                    postgresql_where=held, sqlite_where=held)
    op.create_table("tenant_admission", sa.Column("tenant_id", sa.String(64), nullable=False),
                    sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_admission"))


def downgrade() -> None:
    op.drop_table("tenant_admission")
    op.drop_index("ix_runs_held", table_name="runs")
    op.drop_index("ix_runs_admitted", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("admitted")
        batch.drop_column("concurrency_key")
        batch.drop_column("priority")
