"""Postgres only: a step's usual claim, and its usual completion, each as one autocommit statement.

`pal_claim_step` fences the lease, reads the run's new step events and appends `step_started` for
the attempt the caller predicted from the step log it already holds, but only if none of the new
events concerns that step (then the prediction still holds; otherwise nothing is started and the
caller decides again in a transaction, pal.storage.steps). The first step of a run also flips it from
`queued` to `running`. Called in autocommit mode it is its own transaction: one round trip in
all, where BEGIN, fence-and-read, start and COMMIT were four. Its commit does not wait for its
WAL flush, as 0005's claim (docs/guarantees.md, "Durable commits").

Rows: the step log since `p_after`, then one marker: seq -3 "started", -4 "duplicate" (this
attempt was already claimed under this generation). No marker: not started, decide again. A lone
seq -1 row: fenced out.

`pal_complete_step` is the completion whose hand-off the caller predicted from its step log plus
this step's output: it fences and appends `step_completed` only if no step event was appended
since `p_after` (under the fence's row lock nobody else can append one), so the prediction is
exactly what `pal_complete_fence` and the caller's transaction would decide. It returns the new
event, or nothing (decide again), -1 (fenced out) or -2 (the step had completed already). Its
commit is an ordinary durable one.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The kinds pal.core.step_log.LOG_KINDS names; a migration must not change when that module does.
_LOG_KINDS = "'step_completed', 'step_retrying', 'step_waiting'"
_CLAIM_SIGNATURE = "text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz, boolean"
_COMPLETE_SIGNATURE = "text, integer, text, timestamptz, bigint, text, integer, jsonb, timestamptz"
_FENCE = """
            UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
             WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
            IF NOT FOUND THEN
                RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
                RETURN;
            END IF;
"""
_RESULT = "TABLE(seq bigint, step_id text, kind text, payload jsonb)"


def _insert_once(kind: str) -> str:
    """Append the step's event of `kind` unless a unique index has one: its seq in v_seq, or NULL."""
    return f"""
            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, '{kind}', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"""
        CREATE OR REPLACE FUNCTION pal_claim_step(
            p_run text, p_generation integer, p_worker text, p_expires timestamptz, p_after bigint,
            p_step text, p_attempt integer, p_payload jsonb, p_at timestamptz, p_first boolean)
        RETURNS {_RESULT} AS $$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN
            {_FENCE}
            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
             WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ({_LOG_KINDS})
             ORDER BY e.seq;
            IF EXISTS (SELECT 1 FROM journal_events e
                        WHERE e.run_id = p_run AND e.seq > p_after AND e.step_id = p_step
                          AND e.kind IN ({_LOG_KINDS})) THEN
                RETURN;  -- the caller predicted from an older log: it decides again
            END IF;
            {_insert_once('step_started')}
            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -4::bigint, NULL::text, 'duplicate'::text, NULL::jsonb;
                RETURN;
            END IF;
            IF p_first THEN
                UPDATE runs SET status = 'running', started_at = p_at
                 WHERE runs.id = p_run AND runs.status = 'queued';
            END IF;
            RETURN QUERY SELECT -3::bigint, NULL::text, 'started'::text, NULL::jsonb;
        END $$ LANGUAGE plpgsql
    """)
    op.execute(f"""
        CREATE OR REPLACE FUNCTION pal_complete_step(
            p_run text, p_generation integer, p_worker text, p_expires timestamptz, p_after bigint,
            p_step text, p_attempt integer, p_payload jsonb, p_at timestamptz)
        RETURNS {_RESULT} AS $$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN
            {_FENCE}
            IF EXISTS (SELECT 1 FROM journal_events e
                        WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ({_LOG_KINDS})) THEN
                RETURN;  -- the caller predicted its hand-off from an older log: it decides again
            END IF;
            {_insert_once('step_completed')}
            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -2::bigint, NULL::text, 'already_completed'::text, NULL::jsonb;
                RETURN;
            END IF;
            RETURN QUERY SELECT v_seq, p_step, 'step_completed'::text, p_payload;
        END $$ LANGUAGE plpgsql
    """)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS pal_complete_step({_COMPLETE_SIGNATURE})")
    op.execute(f"DROP FUNCTION IF EXISTS pal_claim_step({_CLAIM_SIGNATURE})")
