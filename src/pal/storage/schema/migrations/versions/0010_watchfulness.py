"""run_anomalies, and a run's own budget.

`run_anomalies` holds one row per anomaly journaled: its primary key (run, kind, step; '' for a
run-level one) is what makes `anomaly_detected` at most once per (run, kind, step), so a re-drive
after a crash never writes one again (docs/anomalies.md). `runs.limits` is the run's own `limits`
block (a per-run override of the graph's budget), stored apart from the plan so the graph's hash,
and the baselines kept per hash, stay the same.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from pal.storage.schema import UtcDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def json_type() -> Any:
    return sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "run_anomalies",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("step_id", sa.String(256), nullable=False),
        sa.Column("payload", json_type(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_anomalies_run_id", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "kind", "step_id", name="pk_run_anomalies"),
    )
    op.create_index("ix_run_anomalies_created_at", "run_anomalies", ["created_at"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("limits", json_type(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("limits")
    op.drop_index("ix_run_anomalies_created_at", table_name="run_anomalies")
    op.drop_table("run_anomalies")
