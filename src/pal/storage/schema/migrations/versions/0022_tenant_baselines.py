"""step_baselines per tenant: a baseline is made from one tenant's runs and read by that tenant's
runs only, so one tenant's usage never moves another's anomaly decisions (docs/anomalies.md,
"Baselines").

The rows are derived (the beat task rewrites every one on its next pass), so they are deleted
rather than guessed a tenant: until that pass, the baseline rules have no samples and stay quiet.
The table is altered, not recreated, so on Postgres its grants (`pal db grant`) are kept.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM step_baselines")
    with op.batch_alter_table("step_baselines") as batch:
        batch.drop_constraint("pk_step_baselines", type_="primary")
        batch.add_column(sa.Column("tenant_id", sa.String(64), nullable=False))
        batch.create_primary_key("pk_step_baselines", ["tenant_id", "graph_hash", "node_id", "metric"])


def downgrade() -> None:
    op.execute("DELETE FROM step_baselines")
    with op.batch_alter_table("step_baselines") as batch:
        batch.drop_constraint("pk_step_baselines", type_="primary")
        batch.drop_column("tenant_id")
        batch.create_primary_key("pk_step_baselines", ["graph_hash", "node_id", "metric"])
