"""Postgres only: NOTIFY pal_journal with the run id of every journal event, so SSE streams wake
at once instead of polling (SQLite keeps polling).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CHANNEL = "pal_journal"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
        CREATE OR REPLACE FUNCTION pal_journal_notify() RETURNS trigger AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.run_id);
            RETURN NULL;
        END $$ LANGUAGE plpgsql
    """)
    op.execute("""
        CREATE TRIGGER journal_events_notify AFTER INSERT ON journal_events
        FOR EACH ROW EXECUTE FUNCTION pal_journal_notify()
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS journal_events_notify ON journal_events")
    op.execute("DROP FUNCTION IF EXISTS pal_journal_notify()")
