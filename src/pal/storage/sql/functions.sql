-- The live definition of PAL's server-side functions on Postgres, in one file.
--
-- pal_claim_fence, pal_complete_fence, pal_start_step: the step protocol's fenced reads and its
-- start (migration 0005); pal_claim_step, pal_complete_step: a step's usual claim and completion
-- as one autocommit statement each (migration 0006); pal_claim_step_after: that claim, which also
-- checks that the steps the caller's log has not seen complete did complete (migration 0019: a
-- worker whose log is behind claims without reading the log first; pal_claim_step is now the
-- same claim with nothing to check); pal_complete_step_then: that completion, which may also start
-- the one successor the caller will run itself (migration 0020), adding a model call's usage to
-- the run's totals (migration 0023; pal_complete_step is now the same
-- completion starting nothing); pal_read_log: the step log a one-call claim
-- reads, writing nothing, before it decides a step is ready (migration 0009; approval_decided is a
-- step-log kind since migration 0012, it resumes a budget pause; confidence_evaluated since 0013,
-- a re-drive reads the gate's score back); pal_journal_notify:
-- NOTIFY for the SSE stream (migration 0003). docs/architecture.md, "The step protocol", says what each decides and why.
--
-- The functions that read the step log plan it once for any run (plan_cache_mode
-- force_generic_plan, migration 0018): a plan made for one call's values can pick the primary key on
-- seq when the statistics end below the newest events, and read every other run's events since
-- p_after; the generic plan always walks ix_journal_events_run_seq from (p_run, p_after). A row
-- comparison, (run_id, seq) > (p_run, p_after), was tried (migration 0017): beside the equality on
-- run_id the index starts at the run's first event, so every read cost the run's length.
--
-- Migrations load this file (pal.storage.sql.load): change a function here, then add a migration
-- that loads the file again and records its new sha256 (tests/integration/test_migrations.py
-- checks that the newest loader's hash is this file's). Each statement ends with a line holding
-- only "-- end", which is where the loader splits the file.

CREATE OR REPLACE FUNCTION pal_claim_fence(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        #variable_conflict use_column
        BEGIN

    UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
     WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
    IF NOT FOUND THEN
        RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
        RETURN;
    END IF;

            -- The claim's commit need not wait for its WAL flush (docs/guarantees.md, "Durable
            -- commits"): a later durable commit flushes it, and losing it is a crash before the claim.
            PERFORM set_config('synchronous_commit', 'off', true);

    RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
     WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')
     ORDER BY e.seq;

        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_complete_fence(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN

    UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
     WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
    IF NOT FOUND THEN
        RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
        RETURN;
    END IF;

            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_completed', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -2::bigint, NULL::text, 'already_completed'::text, NULL::jsonb;
                RETURN;
            END IF;

    RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
     WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')
     ORDER BY e.seq;

        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_start_step(p_run text, p_step text, p_attempt integer, p_generation integer, p_payload jsonb, p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
        DECLARE
            v_seq bigint;
        BEGIN
            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_started', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
            RETURN v_seq;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_claim_step_after(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, p_first boolean, p_needs text[])
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN
            -- p_needs: steps the caller's log has not seen complete, whose completion alone puts
            -- p_step on the ready frontier. The fence is taken only if each has its
            -- step_completed (one probe of uq_journal_step_completed per step, inside the
            -- fence's own statement: no statement more); otherwise nothing is written and the
            -- lease is untouched. A completion is never undone, and the message that asks for
            -- this step was sent after the completion it follows had committed.
            UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
             WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation
               AND (p_needs IS NULL OR NOT EXISTS (
                      SELECT 1 FROM unnest(p_needs) AS needed(step_id)
                       WHERE NOT EXISTS (SELECT 1 FROM journal_events e
                                          WHERE e.run_id = p_run AND e.step_id = needed.step_id
                                            AND e.kind = 'step_completed')));
            IF NOT FOUND THEN
                IF p_needs IS NOT NULL THEN  -- fenced out, or a needed step not complete
                    RETURN QUERY SELECT -5::bigint, NULL::text, 'refused'::text, NULL::jsonb;
                    RETURN;
                END IF;
                RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
                RETURN;
            END IF;

            PERFORM set_config('synchronous_commit', 'off', true);
            RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
             WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')
             ORDER BY e.seq;
            IF EXISTS (SELECT 1 FROM journal_events e
                        WHERE e.run_id = p_run AND e.seq > p_after AND e.step_id = p_step
                          AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')) THEN
                RETURN;  -- the caller predicted from an older log: it decides again
            END IF;

            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_started', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;

            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -4::bigint, NULL::text, 'duplicate'::text, NULL::jsonb;
                RETURN;
            END IF;
            IF p_first THEN
                UPDATE runs SET status = 'running', started_at = p_at
                 WHERE runs.id = p_run AND runs.status = 'queued';
            END IF;
            RETURN QUERY SELECT -3::bigint, NULL::text, 'started'::text, NULL::jsonb;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_claim_step(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, p_first boolean)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE sql
AS $function$
        -- The claim of workers that predate pal_claim_step_after (migration 0019), kept for a
        -- rolling upgrade: the same claim, with nothing to wait for.
        SELECT * FROM pal_claim_step_after(p_run, p_generation, p_worker, p_expires, p_after, p_step,
                                           p_attempt, p_payload, p_at, p_first, NULL::text[]);
$function$;
-- end

CREATE OR REPLACE FUNCTION pal_complete_step_then(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, p_next text, p_next_attempt integer, p_next_payload jsonb)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        #variable_conflict use_column
        DECLARE
            v_seq bigint;
        BEGIN

            UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
             WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
            IF NOT FOUND THEN
                RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
                RETURN;
            END IF;

            IF EXISTS (SELECT 1 FROM journal_events e
                        WHERE e.run_id = p_run AND e.seq > p_after AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')) THEN
                -- The caller predicted its hand-off from an older log: it decides again, in a
                -- transaction. This call wrote only the lease's renewal, which needs no WAL flush
                -- (as a claim's; migration 0021): a durable commit would make a fan-out's branch
                -- wait for one to write nothing.
                PERFORM set_config('synchronous_commit', 'off', true);
                RETURN;
            END IF;

            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, 'step_completed', p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;

            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -2::bigint, NULL::text, 'already_completed'::text, NULL::jsonb;
                RETURN;
            END IF;
            -- A model call's tokens and cost join the run's totals only with the insert that won,
            -- so a duplicate completion never counts them twice (migration 0023).
            IF p_payload ? 'usage' THEN
                UPDATE runs SET input_tokens = runs.input_tokens + (p_payload->'usage'->>'input_tokens')::bigint,
                                output_tokens = runs.output_tokens + (p_payload->'usage'->>'output_tokens')::bigint,
                                cost_usd = runs.cost_usd + (p_payload->'usage'->>'cost_usd')::numeric
                 WHERE runs.id = p_run;
            END IF;
            RETURN QUERY SELECT v_seq, p_step, 'step_completed'::text, p_payload;
            IF p_next IS NULL THEN
                RETURN;
            END IF;

            -- p_next: the one successor this completion makes ready, which the caller will run
            -- itself (a solo worker takes the successor's own message back as it publishes it).
            -- Its attempt starts in this transaction, after the completion it follows: the
            -- caller's claim of it needs no statement of its own (migration 0020).
            v_seq := pal_start_step(p_run, p_next, p_next_attempt, p_generation, p_next_payload, p_at);
            IF v_seq IS NULL THEN
                RETURN QUERY SELECT -4::bigint, NULL::text, 'duplicate'::text, NULL::jsonb;
                RETURN;
            END IF;
            RETURN QUERY SELECT -3::bigint, NULL::text, 'started'::text, NULL::jsonb;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_complete_step(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE sql
AS $function$
        -- The completion of workers that predate pal_complete_step_then (migration 0020), kept
        -- for a rolling upgrade: the same completion, claiming nothing after it.
        SELECT * FROM pal_complete_step_then(p_run, p_generation, p_worker, p_expires, p_after, p_step,
                                             p_attempt, p_payload, p_at, NULL::text, NULL::integer,
                                             NULL::jsonb);
$function$;
-- end

CREATE OR REPLACE FUNCTION pal_read_log(p_run text, p_generation integer, p_after bigint)
 RETURNS TABLE(seq bigint, step_id text, kind text, payload jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        #variable_conflict use_column
        BEGIN
            -- Read only: a claim that turns out not to be ready must leave the lease as it was
            -- (its holder, its expiry, a recovery's redelivery time). The claim that follows
            -- fences again, so only a generation that no longer holds the lease is told here.
            IF NOT EXISTS (SELECT 1 FROM run_locks
                            WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation) THEN
                RETURN QUERY SELECT -1::bigint, NULL::text, 'fenced_out'::text, NULL::jsonb;
                RETURN;
            END IF;
            RETURN QUERY SELECT e.seq, e.step_id::text, e.kind::text, e.payload FROM journal_events e
             WHERE e.run_id = p_run AND e.seq > p_after
               AND e.kind IN ('step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated')
             ORDER BY e.seq;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_journal_notify()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
        BEGIN
            PERFORM pg_notify('pal_journal', NEW.run_id);
            RETURN NULL;
        END $function$;
-- end
