"""The peer of the PAL benchmark: a raw Celery chain, optionally journaling two Postgres rows per hop.

Each hop's `commits` says how (docs/benchmarks.md, "What is measured"):
    0  nothing: the speed limit of one message per node
    2  the floor of journaling: a `started` row committed before the hop's work and a `completed`
       row committed after it, each one single-statement autocommit INSERT (one round trip). As in
       PAL's step protocol, only the second commit waits for its WAL flush: a later durable commit
       makes the first durable too.
    1  both rows in one transaction (BEGIN, INSERT, INSERT, COMMIT): shown for reference; a
       journaling engine cannot do this, since the start must be on record before the work runs

Started by bench/throughput.py as `python -m celery -A bench.celery_floor worker ...` (cwd = the
repository root). Configured only from the environment:

    BENCH_BROKER_URL    Redis broker (same server as PAL's)
    BENCH_KEY_PREFIX    Redis key prefix for broker keys and the done markers
    BENCH_QUEUE         queue name
    BENCH_DATABASE_URL  libpq URL of the Postgres database holding the `bench_hops` table
    BENCH_SCHEMA        schema of `bench_hops`

The Celery settings mirror pal.workers.pal_app.create_app (late acks, prefetch 1, JSON, no results,
task events on), so the only difference from PAL is what a hop does, not how it is delivered.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import redis
from celery import Celery
from celery.signals import worker_process_init

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
KEY_PREFIX = os.environ.get("BENCH_KEY_PREFIX", "palbench-floor:")
QUEUE = os.environ.get("BENCH_QUEUE", "palbench-floor")
DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = os.environ.get("BENCH_SCHEMA", "public")

from pal.workers.pal_app import DELIVERY_SETTINGS  # noqa: E402

app = Celery("bench_floor", set_as_current=False)
app.conf.update(DELIVERY_SETTINGS)
app.conf.update(
    broker_url=BROKER_URL,
    broker_transport_options={"visibility_timeout": 3600, "global_keyprefix": KEY_PREFIX},
    task_default_queue=QUEUE,
)
if os.environ.get("BENCH_FLOOR_TRANSPORT") == "pal":
    # The floor on PAL's Redis transport and worker consumer instead of stock kombu's and Celery's
    # (docs/decisions/celery-fast-paths.md); its hop still publishes through send_task.
    from pal.workers.redis_transport import TRANSPORT

    app.conf.update(broker_transport=TRANSPORT, worker_consumer="pal.workers.consumer:Consumer")

# Postgres connections by purpose and one Redis connection per worker process, opened lazily after
# the fork: "async" and "durable" are autocommit sessions (synchronous_commit off and on), "tx" is
# an ordinary transactional one.
_pg: dict[str, Any] = {}
_redis: redis.Redis | None = None
_SESSION_OPTIONS = {"async": " -csynchronous_commit=off", "durable": "", "tx": ""}


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _reset_after_fork(**_: Any) -> None:
    global _redis
    _pg.clear()
    _redis = None


def _pg_conn(purpose: str) -> Any:
    conn = _pg.get(purpose)
    if conn is None or conn.closed:
        conn = psycopg2.connect(DATABASE_URL, options=f"-csearch_path={SCHEMA}{_SESSION_OPTIONS[purpose]}")
        conn.autocommit = purpose != "tx"
        _pg[purpose] = conn
    return conn


def _redis_conn() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(BROKER_URL)
    return _redis


def done_key(tag: str) -> str:
    """The Redis hash the last hop of each chain of one measurement writes its finish time to."""
    return f"{KEY_PREFIX}done:{tag}"


_INSERT = "INSERT INTO bench_hops (chain, hop, kind) VALUES (%s, %s, %s)"


@app.task(name="bench.hop", shared=False)  # type: ignore[untyped-decorator]
def hop(tag: str, chain: int, index: int, length: int, commits: int) -> None:
    """One node: journal it as `commits` says (see the module's docstring), then send the next hop."""
    row = (f"{tag}:{chain}", index)
    if commits == 2:
        with _pg_conn("async").cursor() as cur:
            cur.execute(_INSERT, (*row, "started"))
        with _pg_conn("durable").cursor() as cur:
            cur.execute(_INSERT, (*row, "completed"))
    elif commits == 1:
        conn = _pg_conn("tx")
        with conn.cursor() as cur:
            cur.execute(_INSERT, (*row, "started"))
            cur.execute(_INSERT, (*row, "completed"))
        conn.commit()
    if index + 1 < length:
        hop.apply_async(args=[tag, chain, index + 1, length, commits], queue=QUEUE)
    else:
        _redis_conn().hset(done_key(tag), str(chain), repr(time.time()))
