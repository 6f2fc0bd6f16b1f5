-- PAL's named queries: every statement its storage sends to Postgres as text, one block each.
--
-- The stores' other queries are SQLAlchemy Core expressions beside each store (portable to SQLite,
-- not text); the server-side functions called here live in functions.sql; the migrations keep
-- their own DDL. Statements composed with identifiers (GRANT, LISTEN) stay beside their code.
--
-- A block is a line `-- name: <name>`, comment lines saying what the query is, then one statement
-- (its lines are joined by a space; no comment after SQL on a line, no closing semicolon).
-- Parameters are $1..$n, each used once and in order, each with an explicit cast: Postgres takes a
-- PREPAREd statement's parameter types from the casts, and the loader (pal.storage.sql.queries,
-- which reads this file once) turns $n into psycopg2's %s in order (so a $ followed by digits is
-- always a parameter, never part of a literal). tests/storage/test_named_queries.py PREPAREs each
-- on a migrated database and checks the casts against the called function's arguments.

-- name: fenced_log
-- A claim's transaction (pal.storage.primitives): fence on the lease, then the run's step log after
-- a seq; one row (outcome, events).
SELECT outcome, events FROM pal_fenced_log($1::text, $2::integer, $3::text, $4::timestamptz, $5::bigint)

-- name: fenced_completion
-- A completion's transaction (pal.storage.primitives): fence, append step_completed once, then the
-- step log after a seq; one row (outcome, events).
SELECT outcome, events FROM pal_fenced_completion($1::text, $2::integer, $3::text, $4::timestamptz,
    $5::bigint, $6::text, $7::integer, $8::jsonb, $9::timestamptz)

-- name: start_step
-- A claim's transaction (pal.storage.primitives): append step_started once per attempt and
-- generation; its seq, NULL when it was there already.
SELECT pal_append_once($1::text, $2::text, $3::integer, 'step_started', $4::jsonb, $5::integer,
    $6::timestamptz)

-- name: claim_step
-- A usual claim as one autocommit call (pal.storage.steps, PREPAREd per connection): fence, check
-- the needed completions and the log, start the attempt; one row (outcome, events).
SELECT * FROM pal_claim($1::text, $2::integer, $3::text, $4::timestamptz, $5::bigint, $6::text,
    $7::integer, $8::jsonb, $9::timestamptz, $10::boolean, $11::text[])

-- name: complete_step
-- A usual completion as one autocommit call (pal.storage.steps, PREPAREd per connection): fence,
-- append step_completed, maybe start the one successor; one row (outcome, seq).
SELECT * FROM pal_complete($1::text, $2::integer, $3::text, $4::timestamptz, $5::bigint, $6::text,
    $7::integer, $8::jsonb, $9::timestamptz, $10::text, $11::integer, $12::jsonb)

-- name: read_step_log
-- The run's step log after a seq while the generation holds the lease, writing nothing (a one-call
-- claim whose log is behind; pal.storage.steps); one row (outcome, events).
SELECT * FROM pal_read_step_log($1::text, $2::integer, $3::bigint)

-- name: ping
-- A pooled connection that sat idle is pinged before use (pal.storage.database).
SELECT 1

-- name: current_schema
-- The schema `pal db grant` grants on: the journal's, the connection's search_path (pal.storage.schema.grants).
SELECT current_schema()

-- name: role_exists
-- A row when the database role exists (pal.storage.schema.grants).
SELECT 1 FROM pg_roles WHERE rolname = $1::text
