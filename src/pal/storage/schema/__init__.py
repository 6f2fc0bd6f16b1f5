"""The single definition of PAL's tables (SQLAlchemy Core). Migrations must agree with it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect

from pal.core.vocabulary import IN_FLIGHT_STATUSES, TERMINAL_EVENT_KINDS, EventKind

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite drops the zone; we put it back)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the journal; pass an aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def json_type() -> Any:
    """JSON, as JSONB on Postgres (migrations use it too)."""
    return sa.JSON().with_variant(JSONB(), "postgresql")


_json = json_type


_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("graph", _json(), nullable=True),
    sa.Column("graph_hash", sa.String(64), nullable=True),
    sa.Column("input", _json(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("output", _json(), nullable=True),
    sa.Column("error", _json(), nullable=True),
    sa.Column("parent_run_id", sa.String(128), nullable=True),
    sa.Column("parent_step_id", sa.String(256), nullable=True),
    sa.Column("tier", sa.String(16), nullable=False),
    sa.Column("cost_usd", sa.Numeric(18, 8), nullable=False),
    sa.Column("input_tokens", sa.BigInteger(), nullable=False),
    sa.Column("output_tokens", sa.BigInteger(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=True),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    sa.Column("limits", _json(), nullable=True),  # the run's own budget (docs/anomalies.md)
    # Lineage (migration 0015, docs/retry-and-fork.md): the run this one retries or forks, how,
    # and (a fork) the step it runs again from.
    sa.Column("source_run_id", sa.String(128), nullable=True),
    sa.Column("source_kind", sa.String(16), nullable=True),
    sa.Column("source_step_id", sa.String(256), nullable=True),
    # Admission (migration 0029, pal.engine.admission): its priority (1 first .. 5 last, NULL 3), its
    # graph's rendered concurrency key, and whether it holds a slot (TRUE), waits for one (FALSE), or
    # was started with no limit to heed or has given its slot back (NULL).
    sa.Column("priority", sa.SmallInteger(), nullable=True),
    sa.Column("concurrency_key", sa.String(256), nullable=True),
    sa.Column("admitted", sa.Boolean(), nullable=True),
    sa.CheckConstraint("kind IN ('graph', 'llm', 'microvm')", name="kind"),
    sa.CheckConstraint(
        "status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')",
        name="status",
    ),
    sa.CheckConstraint("tier IN ('shared', 'microvm')", name="tier"),
    sa.CheckConstraint("source_kind IS NULL OR source_kind IN ('retry', 'fork')", name="source_kind"),
)
sa.Index("ix_runs_tenant_created", runs.c.tenant_id, runs.c.created_at)
# The runs holding an admission slot, and those waiting for one in the order they get it.
sa.Index("ix_runs_admitted", runs.c.tenant_id, runs.c.concurrency_key,
         postgresql_where=runs.c.admitted.is_(True), sqlite_where=runs.c.admitted.is_(True))
sa.Index("ix_runs_held", runs.c.tenant_id, runs.c.priority, runs.c.created_at, runs.c.id,
         postgresql_where=runs.c.admitted.is_(False), sqlite_where=runs.c.admitted.is_(False))
# The runs derived from a run (GET /v1/runs/{id}'s derived_runs): only derived runs are indexed.
sa.Index(
    "ix_runs_source_run_id",
    runs.c.source_run_id,
    postgresql_where=runs.c.source_run_id.is_not(None),
    sqlite_where=runs.c.source_run_id.is_not(None),
)
# Serves the orphan sweep: only in-flight runs are indexed, so finished runs cost nothing.
sa.Index(
    "ix_runs_in_flight",
    runs.c.status,
    runs.c.id,
    postgresql_where=runs.c.status.in_(IN_FLIGHT_STATUSES),
    sqlite_where=runs.c.status.in_(IN_FLIGHT_STATUSES),
)

# Retention (migration 0016, docs/retention.md): `pal runs prune` walks finished top-level runs
# oldest first, and a run's family by parent; both lookups stay off the step path's hot updates
# (finished_at changes once, with status, which ix_runs_in_flight already indexes).
sa.Index(
    "ix_runs_finished",
    runs.c.finished_at,
    runs.c.id,
    postgresql_where=sa.and_(runs.c.parent_run_id.is_(None), runs.c.finished_at.is_not(None)),
    sqlite_where=sa.and_(runs.c.parent_run_id.is_(None), runs.c.finished_at.is_not(None)),
)
sa.Index(
    "ix_runs_parent_run_id",
    runs.c.parent_run_id,
    postgresql_where=runs.c.parent_run_id.is_not(None),
    sqlite_where=runs.c.parent_run_id.is_not(None),
)

journal_events = sa.Table(
    "journal_events",
    metadata,
    sa.Column("seq", _BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("step_id", sa.String(256), nullable=True),
    sa.Column("attempt", sa.Integer(), nullable=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("payload", _json(), nullable=False),
    sa.Column("generation", sa.Integer(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)
sa.Index("ix_journal_events_run_seq", journal_events.c.run_id, journal_events.c.seq)
# Exactly-once completion is a constraint, not a hope: one step_completed per step...
sa.Index(
    "uq_journal_step_completed",
    journal_events.c.run_id,
    journal_events.c.step_id,
    unique=True,
    postgresql_where=journal_events.c.kind == EventKind.STEP_COMPLETED,
    sqlite_where=journal_events.c.kind == EventKind.STEP_COMPLETED,
)
# ...one terminal event per run...
sa.Index(
    "uq_journal_terminal",
    journal_events.c.run_id,
    unique=True,
    postgresql_where=journal_events.c.kind.in_(TERMINAL_EVENT_KINDS),
    sqlite_where=journal_events.c.kind.in_(TERMINAL_EVENT_KINDS),
)
# ...and one claim of an attempt per lease generation, so a duplicate message cannot run a step
# that another worker of the same generation is already running.
sa.Index(
    "uq_journal_step_started",
    journal_events.c.run_id,
    journal_events.c.step_id,
    journal_events.c.attempt,
    journal_events.c.generation,
    unique=True,
    postgresql_where=journal_events.c.kind == EventKind.STEP_STARTED,
    sqlite_where=journal_events.c.kind == EventKind.STEP_STARTED,
)
# ...and one confidence evaluation per step: a re-drive reads the score back, never samples again.
sa.Index(
    "uq_journal_confidence_evaluated",
    journal_events.c.run_id,
    journal_events.c.step_id,
    unique=True,
    postgresql_where=journal_events.c.kind == EventKind.CONFIDENCE_EVALUATED,
    sqlite_where=journal_events.c.kind == EventKind.CONFIDENCE_EVALUATED,
)

run_locks = sa.Table(
    "run_locks",
    metadata,
    sa.Column(
        "run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("worker_id", sa.String(256), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("generation", sa.Integer(), nullable=False),
    # Set by a recovery steal, cleared by the first claim under it: while no worker has claimed
    # the re-driven steps, the sweep re-sends their messages at this time (they may have been
    # lost: a Redis flush, a worker killed before its claim), instead of idling out the lease.
    sa.Column("redeliver_at", UtcDateTime(), nullable=True),
)
# No index on expires_at (migration 0007): the fence that renews it runs twice per step and stays
# a heap-only update only while no index covers the column (Postgres also gets fillfactor 50).
sa.Index(
    "ix_run_locks_redeliver_at",
    run_locks.c.redeliver_at,
    postgresql_where=run_locks.c.redeliver_at.is_not(None),
    sqlite_where=run_locks.c.redeliver_at.is_not(None),
)

side_effect_receipts = sa.Table(
    "side_effect_receipts",
    metadata,
    sa.Column("idempotency_key", sa.String(64), primary_key=True),
    sa.Column(
        "run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("step_id", sa.String(256), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("effect_kind", sa.String(32), nullable=False),
    sa.Column("target", sa.Text(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("response", _json(), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.CheckConstraint("status IN ('claimed', 'delivered', 'failed')", name="status"),
)
sa.Index("ix_side_effect_receipts_run_id", side_effect_receipts.c.run_id)

# The isolated tier's VMs (docs/isolated-tier.md): one row per VM ever spawned for a run, so the
# rows of a run count its resume attempts; unique (run, attempt), so two sweepers never spawn twice.
# `generation` is the run's lease generation the VM reports under (an older VM is fenced out);
# only a sha256 of its report token is kept.
runtime_vms = sa.Table(
    "runtime_vms",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("generation", sa.Integer(), nullable=False),
    sa.Column("driver", sa.String(32), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("spec", _json(), nullable=False),
    sa.Column("host", sa.String(256), nullable=True),
    sa.Column("pid", sa.Integer(), nullable=True),
    sa.Column("token_hash", sa.String(64), nullable=True, unique=True),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("last_heartbeat", UtcDateTime(), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("run_id", "attempt", name="uq_runtime_vms_run_attempt"),
    sa.CheckConstraint("state IN ('pending', 'booting', 'running', 'terminated', 'failed')", name="state"),
)

# Bearer tokens of the control plane (`pal tokens create`): only a sha256 of the secret is stored.
# One row per anomaly journaled: the primary key makes `anomaly_detected` at most once per (run,
# kind, step), with '' as the step of a run-level anomaly (docs/anomalies.md).
run_anomalies = sa.Table(
    "run_anomalies",
    metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("step_id", sa.String(256), nullable=False),
    sa.Column("payload", _json(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("run_id", "kind", "step_id"),
)
sa.Index("ix_run_anomalies_created_at", run_anomalies.c.created_at)

# Recent per-step usage of each node of each tenant's graphs (by hash), the baseline a step's tokens
# and cost are compared with; recomputed by a beat task (docs/anomalies.md, "Baselines"). Keyed by
# tenant (migration 0022): one tenant's usage never moves another's anomaly decisions.
step_baselines = sa.Table(
    "step_baselines",
    metadata,
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("graph_hash", sa.String(64), nullable=False),
    sa.Column("node_id", sa.String(256), nullable=False),
    sa.Column("metric", sa.String(16), nullable=False),  # "tokens" | "cost_usd"
    sa.Column("samples", _json(), nullable=False),  # the most recent values, newest first
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("tenant_id", "graph_hash", "node_id", "metric"),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
)

# Keys this deployment's processes share (migration 0008), read once per process. `fence` signs the
# `pal.execute_node` messages PAL publishes (docs/security.md): a message without a valid signature
# is refused before it touches the journal, so a lease generation is not enough to forge one.
pal_keys = sa.Table(
    "pal_keys",
    metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("secret", sa.String(128), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)
FENCE_KEY = "fence"

# A run `pal runs prune` deleted (migration 0016, docs/retention.md): its id stays taken, so a start
# with that id is refused instead of running (and delivering) again under the same idempotency
# keys, and, with --keep-receipts, its signed receipt bundle (RFC 8785 text) with the tenant that
# may read it. No foreign key: the run is gone.
pruned_runs = sa.Table(
    "pruned_runs",
    metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    sa.Column("pruned_at", UtcDateTime(), nullable=False),
    sa.Column("receipt", sa.Text(), nullable=True),
)

# Signals sent to a run (docs/nodes.md, "wait_event"), kept until a waiting step takes one: a signal
# sent before its wait waits for it. `taken_*` name the step attempt that took it, once.
run_signals = sa.Table(
    "run_signals",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("payload", _json(), nullable=True),
    sa.Column("sent_by", sa.String(256), nullable=False),
    sa.Column("sent_at", UtcDateTime(), nullable=False),
    sa.Column("taken_step", sa.String(256), nullable=True),
    sa.Column("taken_attempt", sa.Integer(), nullable=True),
    sa.Column("taken_at", UtcDateTime(), nullable=True),
)
sa.Index("ix_run_signals_run_name", run_signals.c.run_id, run_signals.c.name, run_signals.c.sent_at)

# A start's dedupe or debounce key (pal.core.start_keys): the run it gave and until when it holds.
# The key is claimed before its run is inserted, in one transaction, so the foreign key is checked
# at commit.
run_start_keys = sa.Table(
    "run_start_keys",
    metadata,
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("purpose", sa.String(16), primary_key=True),
    sa.Column("key", sa.String(256), primary_key=True),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id", ondelete="CASCADE", deferrable=True,
                                                      initially="DEFERRED"), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
)
sa.Index("ix_run_start_keys_run", run_start_keys.c.run_id)

# One row per tenant whose runs are admitted under a limit: admissions of a tenant queue on it.
tenant_admission = sa.Table(
    "tenant_admission",
    metadata,
    sa.Column("tenant_id", sa.String(64), primary_key=True),
)

# A tenant's cron schedules (pal.engine.schedules): the run each tick starts and the next tick due.
# Every beat's pass may fire a due tick; the run's id derives from the schedule and the tick, and
# `next_at` advances only from the value read, so each tick starts one run.
schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("tenant_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("cron", sa.String(128), nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("graph", _json(), nullable=False),
    sa.Column("input", _json(), nullable=True),
    sa.Column("overlap", sa.String(8), nullable=False),
    sa.Column("catch_up", sa.Boolean(), nullable=False),
    sa.Column("paused", sa.Boolean(), nullable=False),
    sa.Column("next_at", UtcDateTime(), nullable=False),
    sa.Column("last_run_id", sa.String(128), nullable=True),
    sa.Column("last_fired_at", UtcDateTime(), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("skipped", sa.Integer(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)
sa.Index("ix_schedules_due", schedules.c.next_at)
