-- PAL's server-side functions on Postgres, in one file: the step protocol's single-call writes.
--
-- Helpers hold what the step functions share: pal_fence (the lease fence, the first write of each),
-- pal_log_kinds (the step log's kinds), pal_step_log (the log after a seq, as one JSON array) and
-- pal_append_once. Each step function answers one row: an `outcome` word and, where it read the
-- log, its `events` ([seq, step_id, kind, payload] in seq order). docs/architecture.md, "The life
-- of one step", says what each decides; docs/decisions/sql-step-functions.md why they look so.
--
--   pal_fenced_log         fence, then the log: a claim's transaction reads this
--   pal_fenced_completion  fence, append step_completed once, then the log: a completion's transaction
--   pal_append_once        append a step_started or step_completed once (the seq, NULL when there already)
--   pal_claim              a usual claim as one autocommit call
--   pal_complete           a usual completion as one autocommit call, maybe starting the successor
--   pal_read_step_log      the log, writing nothing (a one-call claim whose log is behind)
--   pal_journal_notify     NOTIFY for the SSE stream
--
-- The functions that read the log plan it once for any run (plan_cache_mode force_generic_plan, set
-- on each): a plan made for one call's values can pick the primary key on seq and read every other
-- run's events.
--
-- Migrations load this file (pal.storage.sql.load_functions): change a function here, then add a
-- migration that loads the file again and records its new sha256 (tests/integration/test_migrations.py
-- checks that the newest loader's hash is this file's). Each statement ends with a line holding
-- only "-- end", which is where the loader splits the file.

CREATE OR REPLACE FUNCTION pal_fence(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_needs text[] DEFAULT NULL)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
        BEGIN
            -- Extends the lease iff this generation holds it, and locks the run's lock row for the
            -- transaction: every writer of one run passes here, so its step events commit in seq
            -- order. p_needs: steps whose step_completed must exist too, else nothing is written.
            -- Two statements, so each keeps one cached plan (one with `p_needs IS NULL OR ...`
            -- would be planned again at every call: its plan for NULL looks cheaper).
            IF p_needs IS NULL THEN
                UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
                 WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation;
                RETURN FOUND;
            END IF;
            UPDATE run_locks SET expires_at = p_expires, worker_id = p_worker, redeliver_at = NULL
             WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation
               AND NOT EXISTS (SELECT 1 FROM unnest(p_needs) AS needed(step_id)
                                WHERE NOT EXISTS (SELECT 1 FROM journal_events e
                                                   WHERE e.run_id = p_run AND e.step_id = needed.step_id
                                                     AND e.kind = 'step_completed'));
            RETURN FOUND;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_log_kinds()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
        -- The kinds a claim and a hand-off decide on (pal.core.step_log.LOG_KINDS); immutable, so
        -- a plan holds it as a constant.
        SELECT ARRAY['step_completed', 'step_retrying', 'step_waiting', 'approval_decided', 'confidence_evaluated']
$function$;
-- end

CREATE OR REPLACE FUNCTION pal_step_log(p_run text, p_after bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
AS $function$
        BEGIN
            -- `run_id = p_run AND seq > p_after` walks ix_journal_events_run_seq from (p_run,
            -- p_after). Its callers set plan_cache_mode force_generic_plan, which this plan is made
            -- under: a plan made for one call's values could pick the primary key on seq.
            RETURN (SELECT coalesce(jsonb_agg(jsonb_build_array(e.seq, e.step_id, e.kind, e.payload) ORDER BY e.seq), '[]'::jsonb)
                      FROM journal_events e
                     WHERE e.run_id = p_run AND e.seq > p_after AND e.kind = ANY (pal_log_kinds()));
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_fenced_log(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, OUT outcome text, OUT events jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            -- outcome: fenced_out | read
            IF NOT pal_fence(p_run, p_generation, p_worker, p_expires) THEN
                outcome := 'fenced_out';
                events := '[]'::jsonb;
                RETURN;
            END IF;
            -- The fence's commit need not wait for its WAL flush (docs/guarantees.md, "Durable
            -- commits"): a later durable commit flushes it, and losing it is a crash before the claim.
            PERFORM set_config('synchronous_commit', 'off', true);
            outcome := 'read';
            events := pal_step_log(p_run, p_after);
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_fenced_completion(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, OUT outcome text, OUT events jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            -- outcome: fenced_out | already_completed | completed
            events := '[]'::jsonb;
            IF NOT pal_fence(p_run, p_generation, p_worker, p_expires) THEN
                outcome := 'fenced_out';
                RETURN;
            END IF;
            PERFORM pal_restore_start(p_run, p_step, p_attempt, p_worker, p_generation, p_at);
            IF pal_append_once(p_run, p_step, p_attempt, 'step_completed', p_payload, p_generation, p_at) IS NULL THEN
                outcome := 'already_completed';
                RETURN;
            END IF;
            outcome := 'completed';
            events := pal_step_log(p_run, p_after);
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_append_once(p_run text, p_step text, p_attempt integer, p_kind text, p_payload jsonb, p_generation integer, p_at timestamp with time zone)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
        DECLARE
            v_seq bigint;
        BEGIN
            -- A step_started or step_completed, which the journal's unique indexes allow once (per
            -- attempt and generation; per step): its seq, NULL when it was there already.
            INSERT INTO journal_events (run_id, step_id, attempt, kind, payload, generation, created_at)
            VALUES (p_run, p_step, p_attempt, p_kind, p_payload, p_generation, p_at)
            ON CONFLICT DO NOTHING
            RETURNING journal_events.seq INTO v_seq;
            RETURN v_seq;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_restore_start(p_run text, p_step text, p_attempt integer, p_worker text, p_generation integer, p_at timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
        BEGIN
            -- A claim commits without waiting for its WAL, so a Postgres crash or failover may lose
            -- it while its worker goes on; the completion, which waits, writes it back first.
            IF NOT EXISTS (SELECT 1 FROM journal_events e
                            WHERE e.run_id = p_run AND e.step_id = p_step AND e.attempt = p_attempt
                              AND e.kind = 'step_started') THEN
                PERFORM pal_append_once(p_run, p_step, p_attempt, 'step_started',
                                        jsonb_build_object('attempt', p_attempt, 'worker', p_worker, 'restored', true),
                                        p_generation, p_at);
            END IF;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_claim(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, p_first boolean, p_needs text[], OUT outcome text, OUT events jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            -- outcome: refused | log_moved | duplicate | started. The caller predicted p_attempt
            -- from its log up to p_after; p_needs names the steps that log has not seen complete
            -- whose completion alone makes p_step ready (checked inside the fence's statement).
            -- refused: fenced out, or a needed step is not complete; nothing written.
            events := '[]'::jsonb;
            IF NOT pal_fence(p_run, p_generation, p_worker, p_expires, p_needs) THEN
                outcome := 'refused';
                RETURN;
            END IF;
            PERFORM set_config('synchronous_commit', 'off', true);  -- as pal_fenced_log's
            events := pal_step_log(p_run, p_after);
            IF events <> '[]'::jsonb AND EXISTS (
                   SELECT 1 FROM journal_events e
                    WHERE e.run_id = p_run AND e.seq > p_after AND e.step_id = p_step
                      AND e.kind = ANY (pal_log_kinds())) THEN
                outcome := 'log_moved';  -- an event the caller has not seen concerns the step
                RETURN;
            END IF;
            IF pal_append_once(p_run, p_step, p_attempt, 'step_started', p_payload, p_generation, p_at) IS NULL THEN
                outcome := 'duplicate';
                RETURN;
            END IF;
            IF p_first THEN
                UPDATE runs SET status = 'running', started_at = p_at
                 WHERE runs.id = p_run AND runs.status = 'queued';
            END IF;
            outcome := 'started';
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_complete(p_run text, p_generation integer, p_worker text, p_expires timestamp with time zone, p_after bigint, p_step text, p_attempt integer, p_payload jsonb, p_at timestamp with time zone, p_next text, p_next_attempt integer, p_next_payload jsonb, OUT outcome text, OUT seq bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            -- outcome: fenced_out | log_moved | already_completed | completed | next_started |
            -- next_duplicate; seq: the step_completed written. The caller planned its hand-off
            -- from its log up to p_after; p_next is the one successor it will run itself.
            IF NOT pal_fence(p_run, p_generation, p_worker, p_expires) THEN
                outcome := 'fenced_out';
                RETURN;
            END IF;
            IF EXISTS (SELECT 1 FROM journal_events e
                        WHERE e.run_id = p_run AND e.seq > p_after AND e.kind = ANY (pal_log_kinds())) THEN
                -- The plan came from an older log: the caller decides again, in a transaction.
                -- Only the lease's renewal was written, which needs no WAL flush (as a claim's).
                PERFORM set_config('synchronous_commit', 'off', true);
                outcome := 'log_moved';
                RETURN;
            END IF;
            PERFORM pal_restore_start(p_run, p_step, p_attempt, p_worker, p_generation, p_at);
            seq := pal_append_once(p_run, p_step, p_attempt, 'step_completed', p_payload, p_generation, p_at);
            IF seq IS NULL THEN
                outcome := 'already_completed';
                RETURN;
            END IF;
            -- A model call's usage joins the run's totals only with the insert that won.
            IF p_payload ? 'usage' THEN
                UPDATE runs SET input_tokens = runs.input_tokens + (p_payload->'usage'->>'input_tokens')::bigint,
                                output_tokens = runs.output_tokens + (p_payload->'usage'->>'output_tokens')::bigint,
                                cost_usd = runs.cost_usd + (p_payload->'usage'->>'cost_usd')::numeric
                 WHERE runs.id = p_run;
            END IF;
            outcome := 'completed';
            IF p_next IS NULL THEN
                RETURN;
            END IF;
            -- The successor's attempt starts after the completion it follows, in this transaction.
            outcome := CASE WHEN pal_append_once(p_run, p_next, p_next_attempt, 'step_started', p_next_payload, p_generation, p_at) IS NULL
                            THEN 'next_duplicate' ELSE 'next_started' END;
        END $function$;
-- end

CREATE OR REPLACE FUNCTION pal_read_step_log(p_run text, p_generation integer, p_after bigint, OUT outcome text, OUT events jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
        BEGIN
            -- outcome: fenced_out | read. Writes nothing: a claim that turns out not to be ready
            -- must leave the lease as it was; the claim that follows fences again.
            events := '[]'::jsonb;
            IF NOT EXISTS (SELECT 1 FROM run_locks
                            WHERE run_locks.run_id = p_run AND run_locks.generation = p_generation) THEN
                outcome := 'fenced_out';
                RETURN;
            END IF;
            outcome := 'read';
            events := pal_step_log(p_run, p_after);
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
