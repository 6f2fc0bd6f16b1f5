"""Postgres only: the server-side functions again, with `approval_decided` among the step-log kinds.

A budget pause (docs/anomalies.md, "Budgets") parks a step before its node runs; approving it appends
`approval_decided` and no completion, and the step runs once. The claim functions must therefore read
that event (it ends the step's wait) and must not start a step from a log that predates it.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SQL_SHA256 = "764a681f07e4569f61304a891261552699d6531dd514c06ca86c680eab5d1ca9"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the older definitions only read fewer kinds; a downgrade of 0011 follows
