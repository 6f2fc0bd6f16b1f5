"""Postgres only: `pal_complete_step_then` adds a completion's model usage (tokens, cost) to its
run's totals, so a model step's completion is one call like any other step's, and may start its one
successor for the caller (docs/architecture.md, "The life of one step"). Before, a completion with
usage took a transaction of several statements. Loads pal/storage/sql/functions.sql as migration
0009 explains.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

SQL_SHA256 = "d14682d0bbc31abb4ee726cf372363362d7065a9e061fa0cb74a59d17ef07c5f"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the definition of 0021 differs only in leaving usage to the caller's transaction
