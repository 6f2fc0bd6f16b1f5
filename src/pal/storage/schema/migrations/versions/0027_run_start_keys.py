"""`run_start_keys`: a start's dedupe or debounce key and the run it gave (docs/api.md, "Dedupe and
debounce").

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_start_keys",
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "purpose", "key", name="pk_run_start_keys"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_start_keys_run_id", ondelete="CASCADE",
                                deferrable=True, initially="DEFERRED"),
    )
    op.create_index("ix_run_start_keys_run", "run_start_keys", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_start_keys_run", table_name="run_start_keys")
    op.drop_table("run_start_keys")
