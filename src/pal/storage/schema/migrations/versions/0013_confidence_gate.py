"""The confidence gate: `confidence_evaluated` at most once per step (a unique index), and among the
step-log kinds the claim functions read, so a re-drive reads the score back and never samples again
(docs/anomalies.md, "The confidence gate").

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pal.storage.sql import load_functions

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

SQL_SHA256 = "71360f208316ecda12ba96cf2c738e03383395b4dd8b95f7b6cd49a9805ed626"
_ONCE = sa.text("kind = 'confidence_evaluated'")


def upgrade() -> None:
    op.create_index("uq_journal_confidence_evaluated", "journal_events", ["run_id", "step_id"], unique=True,
                    postgresql_where=_ONCE, sqlite_where=_ONCE)
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    op.drop_index("uq_journal_confidence_evaluated", table_name="journal_events")
