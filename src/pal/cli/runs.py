"""`pal run` and `pal runs ...`: start a run, follow it, inspect, decide, resume and cancel runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pal.cli import common
from pal.cli.common import EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_RUN_FAILED, EXIT_TIMEOUT
from pal.errors import PalError, Refused
from pal.plan.documents import load_graph_text

if TYPE_CHECKING:
    from pal.core.records import Event

runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
_BY = typer.Option("--by", help="Who decides (default: $USER).")


def run(
    graph: Annotated[Path, typer.Argument(help="Graph file, JSON or YAML.")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="Run input, JSON.")] = None,
    run_id: Annotated[str | None, typer.Option(
        help="Your own run id (idempotent: the same id, graph and input give the same run; other "
             "work under it exits 6).")] = None,
    follow: Annotated[bool, typer.Option(help="Show steps live until the run ends.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to follow before giving up.")] = 300.0,
    limits: Annotated[str | None, typer.Option(help="The run's own budget, JSON, over the graph's "
                                                    "(docs/anomalies.md).")] = None,
    dedupe_key: Annotated[str | None, typer.Option(
        help="A second start with this key within --dedupe-window gives the first run.")] = None,
    dedupe_window: Annotated[str | None, typer.Option(help="How long the key holds (default 24h).")] = None,
    debounce_key: Annotated[str | None, typer.Option(
        help="Cancel the run this key queued before that has not started; run this one after --debounce.")]
    = None,
    debounce: Annotated[str | None, typer.Option(help="The quiet period a debounced run waits, e.g. 30s.")]
    = None,
    priority: Annotated[int | None, typer.Option(
        help="1 (first) to 5 (last): when it waits for a slot, its place (docs/fairness.md).")] = None,
) -> None:
    """Enqueue a run of GRAPH, then follow it step by step (workers must be running)."""
    from pal.cli.approvals import approval_watcher
    from pal.cli.progress import console, describe
    from pal.cli.progress import follow as follow_run

    if not graph.is_file():
        common.fail(f"graph file {graph} does not exist", EXIT_BAD_INPUT)
    run_input = common.read_json(input, "--input")
    run_limits = common.read_json(limits, "--limits")
    client = common.client()
    try:
        document = load_graph_text(graph.read_text(),
                                   max_bytes=client.settings.max_graph_bytes)
        new_id = client.start_run(document, run_input, run_id=run_id, limits=run_limits,
                                  dedupe_key=dedupe_key, dedupe_window=dedupe_window,
                                  debounce_key=debounce_key, debounce=debounce, priority=priority)
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    out = console()
    out.print(f"run {new_id} queued")
    if not follow:
        return
    # A run that parks on an approval: its prompt, `show` payload and the commands that decide it,
    # then the rest of the run once someone has (docs/api.md, "Approvals").
    watch = approval_watcher(client, new_id, lambda line: out.print("  " + line))
    final = follow_run(lambda seq: client.events(new_id, seq), lambda: client.get_run(new_id),
                       lambda e: out.print("  " + describe(e)), timeout=timeout, watch=watch)
    if final is None:
        if common.checked(lambda: client.get_run(new_id)).status == "waiting":
            common.fail(f"run {new_id} still waits for a person's decision after {timeout:g}s; see "
                        f"`pal runs approvals {new_id}` (the run stays parked until it is decided)",
                        EXIT_TIMEOUT)
        common.fail(f"run {new_id} not finished after {timeout:g}s (is a worker running?)",
              EXIT_TIMEOUT)
    out.print(f"run {new_id} {final.status}")
    if final.status != "succeeded":
        raise typer.Exit(EXIT_RUN_FAILED)


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="Only runs with this status.")] = None,
    graph: Annotated[str | None, typer.Option(help="Only runs of the graph with this name.")] = None,
    since: Annotated[str | None, typer.Option(help="Created at or after: ISO 8601 date or time "
                                                   "(UTC unless it has an offset).")] = None,
    until: Annotated[str | None, typer.Option(help="Created before: ISO 8601 date or time.")] = None,
    search: Annotated[str | None, typer.Option(help="Only runs whose id contains this text (any case).")]
    = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    offset: Annotated[int, typer.Option(min=0, max=1_000_000, help="Skip this many (the next page: "
                                                                   "--offset OFFSET+LIMIT).")] = 0,
    as_json: common.AsJson = False,
) -> None:
    """List runs, newest first (creation time, then id), filtered and a page at a time."""
    from pal.cli.progress import console, runs_table
    from pal.core.run_filters import run_filter

    try:
        chosen = run_filter(status=status, graph=graph, search=search, since=since, until=until)
    except ValueError as exc:
        common.fail(str(exc), EXIT_BAD_INPUT)
    records = common.checked(lambda: common.client().list_runs(limit=limit, offset=offset, filters=chosen))
    if as_json:
        common.print_json([r.as_dict() | {"graph_name": r.graph_name} for r in records])
    else:
        console().print(runs_table(records))


@runs_app.command("show")
def runs_show(
    run_id: str,
    as_json: common.AsJson = False,
) -> None:
    """Show one run: its fields, its lineage both ways (its source_* and the runs derived from it),
    its error with the traceback, and its steps."""
    from pal.cli.run_view import run_lines

    client = common.client()
    record = common.checked(lambda: client.get_run(run_id))
    derived = client.derived_runs(run_id)
    if as_json:
        common.print_json(record.as_dict() | {"derived_runs": derived})
        return
    for line in run_lines(record, common.checked(lambda: client.events(run_id)), derived):
        typer.echo(line)


@runs_app.command("events")
def runs_events(
    run_id: str,
    as_json: common.AsJson = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing events as they land, "
                                                                  "until the run ends (JSON: one per line).")]
    = False,
    timeout: Annotated[float, typer.Option(help="With --follow: seconds before giving up.")] = 3600.0,
) -> None:
    """Print a run's journal; with --follow, live until the run ends (exit 5 past --timeout)."""
    from pal.cli.progress import console, describe, journal_table
    from pal.cli.progress import follow as follow_run

    client = common.client()
    if follow:
        common.checked(lambda: client.get_run(run_id))  # exit 3 for no such run
        out = console()

        def emit(event: Event) -> None:
            if as_json:
                typer.echo(json.dumps(event.as_dict(), default=str))
            else:
                out.print(describe(event))

        final = follow_run(lambda seq: client.events(run_id, seq), lambda: client.get_run(run_id), emit,
                           timeout=timeout)
        if final is None:
            common.fail(f"run {run_id} not finished after {timeout:g}s", EXIT_TIMEOUT)
        return
    events = common.checked(lambda: client.events(run_id))
    if as_json:
        common.print_json([e.as_dict() for e in events])
    else:
        console().print(journal_table(events, f"journal of {run_id}"))


@runs_app.command("resume")
def runs_resume(run_id: str) -> None:
    """Re-drive a run whose lease has lapsed now, instead of waiting for the sweep."""
    from pal.engine.recovery import ResumeRefused, resume

    client = common.client()
    try:
        recovery = resume(client.runtime, run_id)
    except ResumeRefused as exc:
        common.fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    steps = ", ".join(recovery.resumed_steps) or "none (nothing left to run)"
    typer.echo(f"run {run_id} re-driven at generation {recovery.generation}; resumed steps: {steps}")


@runs_app.command("cancel")
def runs_cancel(run_id: str,
                reason: Annotated[str | None, typer.Option(help="Journaled with the cancellation.")] = None,
                by: Annotated[str | None, _BY] = None) -> None:
    """Cancel a run and its unfinished child runs at the next step boundary."""

    client = common.client()
    try:
        cancelled = client.cancel(run_id, reason=reason, by=by)
    except Refused as exc:
        common.fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    children = len(cancelled) - 1
    typer.echo(f"run {run_id} cancelled" + (f", with {children} child run(s)" if children > 0 else ""))


@runs_app.command("signal")
def runs_signal(run_id: str, name: str,
                payload: Annotated[str | None, typer.Option(help="What the signal says, JSON.")] = None,
                by: Annotated[str | None, _BY] = None) -> None:
    """Send signal NAME to a run of PAL_TENANT: a `wait_event` step waiting for it takes it now,
    else the next one does."""
    value = common.read_json(payload, "--payload")
    client = common.client()
    signal_id = common.checked(lambda: client.signal(run_id, name, value, by=by))
    typer.echo(f"signal {name} {signal_id} sent to run {run_id}")


@runs_app.command("anomalies")
def runs_anomalies(
    run_id: Annotated[str | None, typer.Argument(help="One run; all of the tenant's when left out.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: common.AsJson = False,
) -> None:
    """List anomalies journaled (runaway loops, step and retry storms, cost and token spikes)."""
    found = common.checked(lambda: common.client().anomalies(run_id, limit=limit))
    common.print_rows(found, as_json, "no anomalies",
                      lambda a: f"{a['created_at']}  {a['run_id']}  {a['kind']:<16} {a['message']}")


@runs_app.command("vms")
def runs_vms(run_id: str, as_json: common.AsJson = False) -> None:
    """List the VMs of a microVM run, one per attempt (docs/isolated-tier.md)."""
    found = common.checked(lambda: [v.as_dict() for v in common.client().runtime.control.vms(run_id)])
    common.print_rows(found, as_json, f"run {run_id} has no VMs",
                      lambda v: f"attempt {v['attempt']}  {v['id']}  {v['state']:<10} {v['driver']}  "
                                f"host {v['host'] or '-'}  pid {v['pid'] or '-'}  exit {v['exit_code']}"
                                f"{'  ' + v['error'] if v['error'] else ''}")


@runs_app.command("stuck")
def runs_stuck(
    as_json: common.AsJson = False,
) -> None:
    """List queued or running runs whose lease is missing or expired, and for how long."""
    from pal.core.clock import utcnow

    now = utcnow()
    stuck = common.checked(lambda: common.client().runtime.control.stuck_runs(now=now))
    rows = [
        {"id": run.id, "status": run.status,
         "lease_expired_for_s": round((now - lease.expires_at).total_seconds(), 1) if lease else None,
         "last_holder": lease.worker_id if lease else None}
        for run, lease in stuck
    ]

    def line(row: dict[str, Any]) -> str:
        expired = (f"lease expired {row['lease_expired_for_s']}s ago (last holder {row['last_holder']})"
                   if row["last_holder"] else "no lease")
        return f"{row['id']}  {row['status']}  {expired}"

    common.print_rows(rows, as_json, "no stuck runs", line)
