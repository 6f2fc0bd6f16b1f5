"""The long-running processes: `pal worker`, `pal beat`, `pal api` and `pal flower`."""

from __future__ import annotations

from typing import Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_BAD_INPUT

WORKER_QUIET_FLAGS = ("--without-mingle", "--without-gossip")
# What each pool is for, said in the banner (README.md, "Which worker set-up", has the figures).
POOL_CHOICE = {
    "prefork": "pool prefork: each process runs one step at a time in its thread and awaits the rest; "
               "for agents and short steps alike one `--pool solo` worker per core is faster and smaller",
    "solo": "pool solo: one step at a time in this process's thread, awaited ones on its loop; "
            "run one per core, each with its own --hostname",
    "threads": "pool threads: for sync tools that block on I/O; model calls and async tools are awaited "
               "whatever the pool, and a solo worker per core runs them faster",
}


def worker(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
    pool: Annotated[str, typer.Option(help="Celery pool: prefork, threads, solo.")] = "prefork",
    vm_host: Annotated[bool, typer.Option(
        "--vm-host", help="Also start the VMs of microVM runs on this machine (PAL_VM_QUEUE).")] = False,
    hostname: Annotated[str | None, typer.Option(
        help="Celery node name, e.g. pal2@%h: each worker on one machine needs its own.")] = None,
) -> None:
    """Run a Celery worker that executes graph nodes (same as `celery -A pal.workers worker`)."""
    import celery
    import kombu

    from pal.core.redact import redact_text
    from pal.tools import registered_tools
    from pal.workers import app as celery_app
    from pal.workers import celery_private
    from pal.workers.pal_app import broker_paths_off

    settings = celery_app.runtime.settings  # the runtime has imported PAL_TOOL_MODULES by now
    queues = f"{settings.queue},{settings.vm_queue}" if vm_host else settings.queue
    # What this worker will do, before Celery's own banner: credentials in URLs are masked.
    typer.echo(redact_text(f"pal worker: queues {queues}, broker {settings.broker_url}"), err=True)
    typer.echo(redact_text(f"pal worker: journal {settings.database_url}"), err=True)
    if not settings.database_url.startswith("sqlite"):
        typer.echo(f"pal worker: at most {settings.db_pool_size} Postgres connections per worker process, "
                   "shared by its threads and held only around a journal call (PAL_DB_POOL_SIZE)", err=True)
    typer.echo(f"pal worker: awaited steps: up to {settings.async_steps} in flight per worker process on "
               "its event loop (async def tools, model calls), holding no thread while they wait "
               "(PAL_ASYNC_STEPS)", err=True)
    typer.echo(f"pal worker: {POOL_CHOICE.get(pool, '')}", err=True)
    paths = celery_private.fast_paths()
    if paths.off:  # each says why (pal.workers.celery_private): a newer or older Celery/kombu
        typer.echo(f"pal worker: Celery {celery.__version__}, kombu {kombu.__version__}: fast paths "
                   f"{', '.join(paths.off)} off, their public paths on (same guarantees, slower)", err=True)
    by_broker = {path: why for path, why in broker_paths_off(settings.broker_url).items() if paths.on(path)}
    if by_broker:
        typer.echo(f"pal worker: fast paths {', '.join(by_broker)} off for {next(iter(by_broker.values()))}; "
                   "their public paths on (same guarantees, slower)", err=True)
    tools = ", ".join(sorted(registered_tools())) or "none"
    typer.echo(f"pal worker: lease {settings.lease_ttl:g}s, orphan sweep every "
               f"{settings.recovery_interval:g}s (run `pal beat` once per deployment), tools: {tools}",
               err=True)
    argv = ["worker", f"--loglevel={loglevel}", f"--pool={pool}",
            f"--queues={queues}", *WORKER_QUIET_FLAGS]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    if celery_app.runtime.settings.is_embedded_broker:
        argv.append("--without-heartbeat")  # no broadcast on the filesystem broker: nobody listens
    celery_app.worker_main(argv)


def beat(loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info") -> None:
    """Run celery beat, which sends the orphan sweep every PAL_RECOVERY_INTERVAL."""
    from pal.storage.private_files import private_folder
    from pal.workers import app as celery_app

    private_folder(celery_app.runtime.settings.home)  # its schedule file lives there
    celery_app.start(["beat", f"--loglevel={loglevel}"])


def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
) -> None:
    """Serve the control plane: REST and SSE under /v1 (OpenAPI at /docs and /openapi.json)."""
    import uvicorn

    from pal.api import create_api

    uvicorn.run(create_api(common.settings()), host=host, port=port, log_level="info")


def flower(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of Flower's web UI and API.")] = 5555,
    address: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
) -> None:
    """Run Flower on PAL's broker (same as `celery -A pal.workers flower`), with basic auth from
    PAL_FLOWER_BASIC_AUTH (user:password[,user:password...]); it refuses to start without it."""
    import os

    from pal.workers import app as celery_app

    auth = os.environ.get("PAL_FLOWER_BASIC_AUTH", "").strip()
    if not auth or any(":" not in pair for pair in auth.split(",")):
        common.fail("set PAL_FLOWER_BASIC_AUTH=user:password (Flower shows task arguments; it must "
                    "not run open)", EXIT_BAD_INPUT)
    if celery_app.runtime.settings.is_embedded_broker:
        common.fail("Flower needs a broker with events, e.g. PAL_BROKER_URL=redis://127.0.0.1:6379/0",
              EXIT_BAD_INPUT)
    from pal.api.flower import start_flower

    # Not celery_app.start(["flower", ...]) alone: stock Flower leaves /metrics and /healthcheck
    # open behind --basic-auth; start_flower guards every route (docs/api.md, "Flower").
    start_flower(celery_app, auth, [f"--port={port}", f"--address={address}"])
