"""pal_keys: the key that signs PAL's own `pal.execute_node` messages.

A step message names (run, step, generation). The generation is a small integer that anyone who
can reach the broker can guess, so PAL's messages also carry an HMAC of those three under this
key, and a worker refuses a message whose signature does not verify (docs/security.md). The key is
generated here, once per database, from the operating system's random source; every PAL process
reads it once.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from pal.storage.schema import FENCE_KEY, UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    keys = op.create_table(
        "pal_keys",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_pal_keys"),
    )
    op.bulk_insert(keys, [{"name": FENCE_KEY, "secret": secrets.token_hex(32),
                           "created_at": datetime.now(UTC)}])


def downgrade() -> None:
    op.drop_table("pal_keys")
