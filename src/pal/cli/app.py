"""The `pal` command line.

Exit codes: 0 success; 1 the run failed or was cancelled; 2 invalid input (graph, JSON, option);
3 no such run; 4 the journal database failed; 5 timed out waiting; 6 refused (e.g. resuming a run
with a step running under a live lease, approving a step that is not waiting, cancelling a finished
run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from pal.cli import demo as demo_module
from pal.config import Settings, load_settings
from pal.errors import ConfigError, GraphError, InputError, PalError, Refused, RunNotFound, StorageError
from pal.plan.graph import load_graph_text

EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_STORAGE, EXIT_TIMEOUT, EXIT_REFUSED = 1, 2, 3, 4, 5, 6

app = typer.Typer(help="PAL: durable AI-agent graphs on Celery.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
db_app = typer.Typer(help="Journal database.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
tokens_app = typer.Typer(help="Bearer tokens of the control plane (`pal api`).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(runs_app, name="runs")
app.add_typer(tokens_app, name="tokens")


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _exit_code(exc: PalError) -> int:
    if isinstance(exc, GraphError | InputError | ConfigError):
        return EXIT_BAD_INPUT
    if isinstance(exc, RunNotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, StorageError):
        return EXIT_STORAGE
    if isinstance(exc, Refused):
        return EXIT_REFUSED
    return 1


def _client() -> Any:
    from pal.client import Client

    try:
        return Client(_settings())
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply the journal schema migrations (idempotent)."""
    from pal.storage.database import shared_engine
    from pal.storage.schema.migrate import current_revision, upgrade

    settings = _settings()
    engine = shared_engine(settings.database_url)
    try:
        upgrade(engine)
        typer.echo(f"journal at revision {current_revision(engine)} ({engine.url!r})")
    except Exception as exc:  # alembic and drivers raise their own types; show them plainly
        _fail(f"migration failed: {exc}", EXIT_STORAGE)


@db_app.command("grant")
def db_grant(
    role: Annotated[str, typer.Argument(help="An existing Postgres role that owns nothing.")],
) -> None:
    """Grant ROLE the least privilege PAL's worker, beat and API need (run as the schema's owner)."""
    from pal.storage.database import shared_engine
    from pal.storage.schema.grants import grant_app_role

    try:
        statements = grant_app_role(shared_engine(_settings().database_url), role)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    except Exception as exc:  # the driver's own errors: show them plainly
        _fail(f"grant failed: {exc}", EXIT_STORAGE)
    for statement in statements:
        typer.echo(statement)


# PAL never revokes a Celery task (a cancel goes through the journal) and needs no worker elections,
# so mingle (a second's wait at start for the neighbours' revoked ids) and gossip (each worker
# consuming every other's events) buy nothing. Heartbeats stay: Flower shows a worker by them.
WORKER_QUIET_FLAGS = ("--without-mingle", "--without-gossip")


@app.command()
def worker(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
    pool: Annotated[str, typer.Option(help="Celery pool: prefork, threads, solo.")] = "prefork",
) -> None:
    """Run a Celery worker that executes graph nodes (same as `celery -A pal.workers worker`)."""
    from pal.workers import app as celery_app

    argv = ["worker", f"--loglevel={loglevel}", f"--pool={pool}",
            f"--queues={celery_app.runtime.settings.queue}", *WORKER_QUIET_FLAGS]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if celery_app.runtime.settings.is_embedded_broker:
        argv.append("--without-heartbeat")  # no broadcast on the filesystem broker: nobody listens
    celery_app.worker_main(argv)


@app.command()
def beat(loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info") -> None:
    """Run celery beat, which sends the orphan sweep every PAL_RECOVERY_INTERVAL."""
    from pal.workers import app as celery_app

    celery_app.runtime.settings.home.mkdir(parents=True, exist_ok=True)  # its schedule file lives there
    celery_app.start(["beat", f"--loglevel={loglevel}"])


def _read_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"{what} is not JSON: {exc}", EXIT_BAD_INPUT)


@app.command()
def run(
    graph: Annotated[Path, typer.Argument(help="Graph file, JSON or YAML.")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="Run input, JSON.")] = None,
    run_id: Annotated[str | None, typer.Option(help="Your own run id (idempotent).")] = None,
    follow: Annotated[bool, typer.Option(help="Show steps live until the run ends.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to follow before giving up.")] = 300.0,
) -> None:
    """Enqueue a run of GRAPH, then follow it step by step (workers must be running)."""
    from pal.cli.progress import console, describe
    from pal.cli.progress import follow as follow_run

    if not graph.is_file():
        _fail(f"graph file {graph} does not exist", EXIT_BAD_INPUT)
    run_input = _read_json(input, "--input")
    client = _client()
    try:
        document = load_graph_text(graph.read_text(),
                                   max_bytes=client.settings.max_graph_bytes)
        new_id = client.start_run(document, run_input, run_id=run_id)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    out = console()
    out.print(f"run {new_id} queued")
    if not follow:
        return
    final = follow_run(lambda seq: client.events(new_id, seq), lambda: client.get_run(new_id),
                       lambda e: out.print("  " + describe(e)), timeout=timeout)
    if final is None:
        _fail(f"run {new_id} not finished after {timeout:g}s (is a worker running?)",
              EXIT_TIMEOUT)
    out.print(f"run {new_id} {final.status}")
    if final.status != "succeeded":
        raise typer.Exit(EXIT_RUN_FAILED)


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="Only runs with this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List runs, newest first."""
    from pal.cli.progress import console, runs_table
    from pal.core.vocabulary import IN_FLIGHT_STATUSES, TERMINAL_STATUSES

    valid = (*IN_FLIGHT_STATUSES, "waiting", *TERMINAL_STATUSES)
    if status is not None and status not in valid:
        _fail(f"unknown status {status!r} (one of: {', '.join(valid)})", EXIT_BAD_INPUT)
    try:
        records = _client().list_runs(status=status, limit=limit, offset=offset)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    if as_json:
        _print_json([r.as_dict() for r in records])
    else:
        console().print(runs_table(records))


@runs_app.command("show")
def runs_show(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show one run."""
    try:
        record = _client().get_run(run_id)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    data = record.as_dict()
    if as_json:
        _print_json(data)
        return
    for key, value in data.items():
        typer.echo(f"{key:>15}: {json.dumps(value, default=str)}")


@runs_app.command("events")
def runs_events(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print a run's journal."""
    from pal.cli.progress import console, journal_table

    try:
        events = _client().events(run_id)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    if as_json:
        _print_json([e.as_dict() for e in events])
    else:
        console().print(journal_table(events, f"journal of {run_id}"))


@runs_app.command("resume")
def runs_resume(run_id: str) -> None:
    """Re-drive a run whose lease has lapsed now, instead of waiting for the sweep."""
    from pal.engine.recovery import ResumeRefused, resume

    client = _client()
    try:
        recovery = resume(client.runtime, run_id)
    except ResumeRefused as exc:
        _fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    steps = ", ".join(recovery.resumed_steps) or "none (nothing left to run)"
    typer.echo(f"run {run_id} re-driven at generation {recovery.generation}; resumed steps: {steps}")


def _decide(run_id: str, step_id: str, decision: str, comment: str | None, by: str | None,
            expected_hash: str | None) -> None:
    from pal.errors import Refused

    client = _client()
    try:
        outcome = client.decide(run_id, step_id, decision, comment=comment, by=by,
                                expected_hash=expected_hash)
    except Refused as exc:
        _fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    after = "the run finished" if outcome.finished else (
        f"dispatched: {', '.join(outcome.dispatch)}" if outcome.dispatch else "the run waits for more")
    typer.echo(f"run {run_id} step {step_id}: {decision}; {after}")


_COMMENT = typer.Option("--comment", "-m", help="Why; journaled with the decision.")
_BY = typer.Option("--by", help="Who decides (default: $USER).")
_HASH = typer.Option("--hash", help="Refuse unless the pending approval's hash is this (what you reviewed).")


@runs_app.command("approve")
def runs_approve(run_id: str, step_id: str,
                 comment: Annotated[str | None, _COMMENT] = None,
                 by: Annotated[str | None, _BY] = None,
                 expected_hash: Annotated[str | None, _HASH] = None) -> None:
    """Approve a waiting approval step; the run continues on its `approved` branch."""
    _decide(run_id, step_id, "approved", comment, by, expected_hash)


@runs_app.command("reject")
def runs_reject(run_id: str, step_id: str,
                comment: Annotated[str | None, _COMMENT] = None,
                by: Annotated[str | None, _BY] = None,
                expected_hash: Annotated[str | None, _HASH] = None) -> None:
    """Reject a waiting approval step: the `rejected` branch, or the run fails without one."""
    _decide(run_id, step_id, "rejected", comment, by, expected_hash)


@runs_app.command("approvals")
def runs_approvals(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the run's pending approvals, including those of its child runs (nested)."""
    try:
        pending = _client().pending_approvals(run_id)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    if as_json:
        _print_json([p.as_dict() for p in pending])
        return
    if not pending:
        typer.echo(f"no pending approvals under run {run_id}")
    for p in pending:
        where = "" if p.depth == 0 else f"  (child run, depth {p.depth})"
        expires = f"  expires {p.expires_at}" if p.expires_at else ""
        typer.echo(f"{p.run_id} {p.step_id}: {json.dumps(p.prompt)}  hash {p.approval_hash}"
                   f"{expires}{where}")


@runs_app.command("cancel")
def runs_cancel(run_id: str,
                reason: Annotated[str | None, typer.Option(help="Journaled with the cancellation.")] = None,
                by: Annotated[str | None, _BY] = None) -> None:
    """Cancel a run and its unfinished child runs at the next step boundary."""
    from pal.errors import Refused

    client = _client()
    try:
        cancelled = client.cancel(run_id, reason=reason, by=by)
    except Refused as exc:
        _fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    children = len(cancelled) - 1
    typer.echo(f"run {run_id} cancelled" + (f", with {children} child run(s)" if children > 0 else ""))


@runs_app.command("stuck")
def runs_stuck(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List queued or running runs whose lease is missing or expired, and for how long."""
    from pal.core.clock import utcnow

    now = utcnow()
    try:
        stuck = _client().runtime.journal.stuck_runs(now=now)
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    rows = [
        {"id": run.id, "status": run.status,
         "lease_expired_for_s": round((now - lease.expires_at).total_seconds(), 1) if lease else None,
         "last_holder": lease.worker_id if lease else None}
        for run, lease in stuck
    ]
    if as_json:
        _print_json(rows)
        return
    if not rows:
        typer.echo("no stuck runs")
    for row in rows:
        expired = (f"lease expired {row['lease_expired_for_s']}s ago (last holder {row['last_holder']})"
                   if row["last_holder"] else "no lease")
        typer.echo(f"{row['id']}  {row['status']}  {expired}")


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option(help="The tenant whose runs the token may see and start.")],
    name: Annotated[str, typer.Option(help="A label, e.g. who or what uses it.")] = "default",
) -> None:
    """Create a token; its secret is printed once (only a hash is stored)."""
    from pal.core.clock import utcnow
    from pal.engine.runs import RUN_ID

    if not RUN_ID.fullmatch(tenant) or len(tenant) > 64:
        _fail(f"tenant {tenant!r} is invalid: 1-64 letters, digits, _ . : - starting with a letter or digit",
              EXIT_BAD_INPUT)
    try:
        token_id, secret = _client().runtime.journal.create_token(tenant_id=tenant, name=name[:128],
                                                                  now=utcnow())
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    typer.echo(f"token {token_id} for tenant {tenant} (store the secret now; it is not shown again):")
    typer.echo(secret)


@tokens_app.command("revoke")
def tokens_revoke(token_id: str) -> None:
    """Revoke a token at once."""
    from pal.core.clock import utcnow

    if not _client().runtime.journal.revoke_token(token_id=token_id, now=utcnow()):
        _fail(f"no live token {token_id!r}", EXIT_NOT_FOUND)
    typer.echo(f"token {token_id} revoked")


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens (never their secrets)."""
    for row in _client().runtime.journal.list_tokens():
        state = f"revoked {row['revoked_at']:%Y-%m-%d %H:%M}" if row["revoked_at"] else "live"
        typer.echo(f"{row['id']}  tenant {row['tenant_id']}  {row['name']}  {state}")


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
) -> None:
    """Serve the control plane: REST and SSE under /v1 (OpenAPI at /docs and /openapi.json)."""
    import uvicorn

    from pal.api import create_api

    uvicorn.run(create_api(_settings()), host=host, port=port, log_level="info")


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Check the journal against its invariants; exit 0 only when it is clean (1 otherwise)."""
    try:
        found = _client().runtime.journal.violations()
    except PalError as exc:
        _fail(str(exc), _exit_code(exc))
    if as_json:
        _print_json([v.as_dict() for v in found])
    else:
        for v in found:
            step = f" step {v.step_id}" if v.step_id else ""
            typer.echo(f"{v.kind}: run {v.run_id}{step}: {v.detail}")
        typer.echo("journal is clean" if not found else f"{len(found)} violation(s)")
    if found:
        raise typer.Exit(EXIT_RUN_FAILED)


@app.command()
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
        _fail("set PAL_FLOWER_BASIC_AUTH=user:password (Flower shows task arguments; it must not run open)",
              EXIT_BAD_INPUT)
    if celery_app.runtime.settings.is_embedded_broker:
        _fail("Flower needs a broker with events, e.g. PAL_BROKER_URL=redis://127.0.0.1:6379/0",
              EXIT_BAD_INPUT)
    from pal.api.flower import start_flower

    # Not celery_app.start(["flower", ...]) alone: stock Flower leaves /metrics and /healthcheck
    # open behind --basic-auth; start_flower guards every route (docs/api.md, "Flower").
    start_flower(celery_app, auth, [f"--port={port}", f"--address={address}"])


@app.command()
def demo(
    tickets: Annotated[int, typer.Option(min=1, max=len(demo_module.DEMO_TICKETS),
                                         help="How many tickets to triage.")] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the runs.")] = 120.0,
) -> None:
    """Triage support tickets with an agent graph, one node per Celery message, and print the
    journal. Uses the embedded default (SQLite + filesystem broker) unless PAL_* say otherwise."""
    from pal.cli.progress import console, describe, journal_table
    from pal.storage.database import shared_engine
    from pal.storage.schema.migrate import upgrade

    settings = _settings()
    out = console()
    out.print(f"PAL demo: journal {settings.database_url}, broker {settings.broker_url}")
    upgrade(shared_engine(settings.database_url))
    out.print("schema up to date; starting a `pal worker` process (2 children)…")
    worker_process = demo_module.start_worker_process(settings.home)
    try:
        client = _client()
        names: dict[str, str] = {}
        provider, model = demo_module.demo_model()
        out.print(f"replies are drafted by an ai-step: provider {provider}, model {model}"
                  + (" (offline; set OPENAI_API_KEY or ANTHROPIC_API_KEY for a real one)"
                     if provider == "scripted" else ""))
        graph = demo_module.triage_graph(provider, model)
        for ticket in demo_module.DEMO_TICKETS[:tickets]:
            run_id = client.start_run(graph, ticket)
            names[run_id] = ticket["id"]
            out.print(f"queued {run_id} for ticket {ticket['id']}: {ticket['text']!r}")
        seen = dict.fromkeys(names, 0)

        def drain() -> bool:
            for run_id, last in seen.items():
                for event in client.events(run_id, last):
                    out.print(f"  [{names[run_id]}] {describe(event)}")
                    seen[run_id] = event.seq
            return all(client.get_run(r).terminal for r in names)

        if not demo_module.wait_until(drain, timeout):
            _fail(f"runs not finished after {timeout:g}s; see {settings.home}/demo-worker.log",
                  EXIT_TIMEOUT)
        drain()
        failed = 0
        for run_id, ticket_id in names.items():
            record = client.get_run(run_id)
            failed += record.status != "succeeded"
            out.print(journal_table(client.events(run_id),
                                    f"journal of {run_id} (ticket {ticket_id}): {record.status}, "
                                    f"{record.input_tokens}+{record.output_tokens} tokens, "
                                    f"${record.cost_usd:.6f}"))
        out.print(f"{len(names) - failed} of {len(names)} runs succeeded; "
                  f"each step above was one Celery message. Inspect with `pal runs list`.")
        if failed:
            raise typer.Exit(EXIT_RUN_FAILED)
    finally:
        demo_module.stop_process(worker_process)


def main() -> None:
    try:
        app()
    except PalError as exc:  # anything not mapped by a command: a clean message, not a trace
        typer.echo(f"error: {exc}", err=True)
        sys.exit(_exit_code(exc))


if __name__ == "__main__":
    main()
