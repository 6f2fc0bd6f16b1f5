"""step_baselines: recent per-step usage of each node of each graph, which a step's tokens and cost
are compared with (docs/anomalies.md, "Baselines").

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from pal.storage.schema import UtcDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def json_type() -> Any:
    return sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "step_baselines",
        sa.Column("graph_hash", sa.String(64), nullable=False),
        sa.Column("node_id", sa.String(256), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("samples", json_type(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("graph_hash", "node_id", "metric", name="pk_step_baselines"),
    )


def downgrade() -> None:
    op.drop_table("step_baselines")
