"""Postgres only: the server-side functions from their one file, pal/storage/sql/functions.sql.

The definitions migrations 0003, 0005 and 0006 left (whitespace aside), plus `pal_read_log`: the
step log a one-call claim reads before it decides a step is ready, writing nothing (the fenced read
it used before committed a lease renewal even for a claim then refused as not ready). From here on a
function is changed by editing that file and adding a migration like this one, which loads it and
records the sha256 it was written for.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SQL_SHA256 = "564cfaf2fae30042a01b8a328b8a8f5fda83d97fe6f11a27f1ff39cc6a912ce9"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # the same functions as 0008's: nothing to undo
