"""The durable core: runs, journal_events, run_locks, side_effect_receipts.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TERMINAL = "kind IN ('run_succeeded', 'run_failed', 'run_cancelled')"


def _json() -> sa.types.TypeEngine[Any]:
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("graph", _json(), nullable=True),
        sa.Column("graph_hash", sa.String(64), nullable=True),
        sa.Column("input", _json(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("output", _json(), nullable=True),
        sa.Column("error", _json(), nullable=True),
        sa.Column("parent_run_id", sa.String(128), nullable=True),
        sa.Column("parent_step_id", sa.String(256), nullable=True),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("cost_usd", sa.Numeric(18, 8), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.CheckConstraint("kind IN ('graph', 'llm')", name="ck_runs_kind"),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')",
            name="ck_runs_status",
        ),
        sa.CheckConstraint("tier IN ('shared', 'microvm')", name="ck_runs_tier"),
    )
    op.create_index("ix_runs_tenant_created", "runs", ["tenant_id", "created_at"])
    in_flight = sa.text("status IN ('queued', 'running')")
    op.create_index(
        "ix_runs_in_flight",
        "runs",
        ["status", "id"],
        postgresql_where=in_flight,
        sqlite_where=in_flight,
    )

    op.create_table(
        "journal_events",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step_id", sa.String(256), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_journal_events"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_journal_events_run_id", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_journal_events_run_seq", "journal_events", ["run_id", "seq"])
    completed = sa.text("kind = 'step_completed'")
    op.create_index(
        "uq_journal_step_completed",
        "journal_events",
        ["run_id", "step_id"],
        unique=True,
        postgresql_where=completed,
        sqlite_where=completed,
    )
    terminal = sa.text(_TERMINAL)
    op.create_index(
        "uq_journal_terminal",
        "journal_events",
        ["run_id"],
        unique=True,
        postgresql_where=terminal,
        sqlite_where=terminal,
    )
    started = sa.text("kind = 'step_started'")
    op.create_index(
        "uq_journal_step_started",
        "journal_events",
        ["run_id", "step_id", "attempt", "generation"],
        unique=True,
        postgresql_where=started,
        sqlite_where=started,
    )

    op.create_table(
        "run_locks",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("worker_id", sa.String(256), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_run_locks"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_locks_run_id", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_run_locks_expires_at", "run_locks", ["expires_at"])

    op.create_table(
        "side_effect_receipts",
        sa.Column("idempotency_key", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step_id", sa.String(256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("effect_kind", sa.String(32), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("response", _json(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key", name="pk_side_effect_receipts"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_side_effect_receipts_run_id", ondelete="CASCADE"
        ),
        sa.CheckConstraint(
            "status IN ('claimed', 'delivered', 'failed')", name="ck_side_effect_receipts_status"
        ),
    )
    op.create_index("ix_side_effect_receipts_run_id", "side_effect_receipts", ["run_id"])


def downgrade() -> None:
    op.drop_table("side_effect_receipts")
    op.drop_table("run_locks")
    op.drop_table("journal_events")
    op.drop_table("runs")
