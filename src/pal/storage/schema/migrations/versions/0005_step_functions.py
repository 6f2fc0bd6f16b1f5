"""Postgres only: the step protocol's hot statements as server-side functions.

A claim fences the lease and reads the run's new step events; a completion fences, appends
`step_completed` and reads them. As plain statements each was several round trips, and Postgres
planned every one of them again on every step (planning cost more than running them). A plpgsql
function is one round trip and keeps its plans for the session (an SQL-language one would not).
Each statement in a function takes a fresh snapshot, so the read sees everything committed by the
lease's previous holder once the fence's row lock is granted (a single CTE could not: its snapshot
predates the lock wait).

A claim commits without waiting for its WAL to reach the disk; see docs/guarantees.md.

The decisions stay in Python (pal.storage.steps, pal.core.step_log); the
functions only run the SQL in order.
A row with seq -1 means "fenced out", -2 "this step already has its step_completed".

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The kinds pal.core.step_log.LOG_KINDS names; a migration must not change when that module does.
_LOG_KINDS = "'step_completed', 'step_retrying', 'step_waiting'"

_FENCE = """
    UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
     WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
    IF NOT FOUND THEN
        RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
        RETURN;
    END IF;
"""

_LOG_SINCE = f"""
    RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
     WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ({_LOG_KINDS})
     ORDER BY e.seq;
"""

_RESULT = "TABLE(seq bigint, step_id text, kind text, payload jsonb)"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
        CREATE OR REPLACE FUNCTION pal_claim_fence(
            p_run text, p_generation integer, p_worker text, p_expires timestamptz, p_after bigint)
        RETURNS {_RESULT} AS $$
        #variable_conflict use_column
        BEGIN
            {_FENCE}
            -- The claim's commit need not wait for its WAL flush (docs/guarantees.md, "Durable
            -- commits"): a later durable commit flushes it, and losing it is a crash before the claim.
            PERFORM set_config('synchronous_commit', 'off', true);
            {_LOG_SINCE}
        END $$ LANGUAGE plpgsql
    """)
    op.execute(f"""
        CREATE OR REPLACE FUNCTION pal_complete_fence(
            p_run text, p_generation integer, p_worker text, p_expires timestamptz, p_after bigint,
            p_step text, p_attempt integer, p_payload jsonb, p_at timestamptz)
        RETURNS {_RESULT} AS $$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN
            {_FENCE}
            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_completed', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -2::bigint, NULL::text, 'already_completed'::text, NULL::jsonb;
                RETURN;
            END IF;
            {_LOG_SINCE}
        END $$ LANGUAGE plpgsql
    """)
    op.execute("""
        CREATE OR REPLACE FUNCTION pal_start_step(
            p_run text, p_step text, p_attempt integer, p_generation integer, p_payload jsonb,
            p_at timestamptz)
        RETURNS bigint AS $$
        DECLARE
            v_seq bigint;
        BEGIN
            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_started', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
            RETURN v_seq;
        END $$ LANGUAGE plpgsql
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS pal_start_step(text, text, integer, integer, jsonb, timestamptz)")
    op.execute("DROP FUNCTION IF EXISTS pal_complete_fence(text, integer, text, timestamptz, bigint, "
               "text, integer, jsonb, timestamptz)")
    op.execute("DROP FUNCTION IF EXISTS pal_claim_fence(text, integer, text, timestamptz, bigint)")
