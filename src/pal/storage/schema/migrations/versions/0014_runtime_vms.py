"""The isolated tier: `runtime_vms`, and `microvm` as a run kind (docs/isolated-tier.md).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime, json_type

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_vms",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("driver", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", json_type(), nullable=False),
        sa.Column("host", sa.String(256), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("last_heartbeat", UtcDateTime(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_runtime_vms_run_id", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_runtime_vms"),
        sa.UniqueConstraint("run_id", "attempt", name="uq_runtime_vms_run_attempt"),
        sa.UniqueConstraint("token_hash", name="uq_runtime_vms_token_hash"),
        sa.CheckConstraint("state IN ('pending', 'booting', 'running', 'terminated', 'failed')",
                           name="ck_runtime_vms_state"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_kind", type_="check")
        batch.create_check_constraint("ck_runs_kind", "kind IN ('graph', 'llm', 'microvm')")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("ck_runs_kind", type_="check")
        batch.create_check_constraint("ck_runs_kind", "kind IN ('graph', 'llm')")
    op.drop_table("runtime_vms")
