"""`pal schedules add|list|pause|resume|delete`: run a graph on a cron, for this shell's tenant
(PAL_TENANT). celery beat (`pal beat`) starts the runs (pal.engine.schedules)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_BAD_INPUT
from pal.plan.documents import load_graph_text

if TYPE_CHECKING:
    from pal.core.records import Schedule

schedules_app = typer.Typer(help="Run graphs on a cron (celery beat starts them).", no_args_is_help=True)


def _line(schedule: Schedule) -> str:
    state = "paused" if schedule.paused else f"next {schedule.next_at:%Y-%m-%d %H:%M:%S}Z"
    last = f"  last run {schedule.last_run_id}" if schedule.last_run_id else ""
    error = f"  last error: {schedule.last_error[:200]}" if schedule.last_error else ""
    return (f"{schedule.name}  {schedule.cron!r} {schedule.timezone}  overlap {schedule.overlap}"
            f"{'  catch-up' if schedule.catch_up else ''}  {state}{last}{error}")


@schedules_app.command("add")
def schedules_add(
    name: Annotated[str, typer.Argument(help="The schedule's name, unique in the tenant.")],
    graph: Annotated[Path, typer.Argument(help="Graph file, JSON or YAML.")],
    cron: Annotated[str, typer.Option(help="Five cron fields, e.g. \"0 9 * * 1-5\", or @daily.")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="Each run's input, JSON.")] = None,
    tz: Annotated[str, typer.Option(help="The IANA time zone the cron reads in.")] = "UTC",
    overlap: Annotated[str, typer.Option(
        help="While the previous run is in flight: skip the tick, queue it, or cancel that run.")] = "skip",
    catch_up: Annotated[bool, typer.Option(help="After downtime, a run per missed tick (else one).")] = False,
) -> None:
    """Add a schedule: GRAPH runs at each tick of --cron."""
    from pal.engine.schedules import add_schedule

    if not graph.is_file():
        common.fail(f"graph file {graph} does not exist", EXIT_BAD_INPUT)
    client = common.client()
    limit = client.settings.max_graph_bytes
    document = common.checked(lambda: load_graph_text(graph.read_text(), max_bytes=limit))
    run_input = common.read_json(input, "--input")
    added = common.checked(lambda: add_schedule(
        client.runtime, tenant_id=client.settings.tenant, name=name, cron=cron, graph=document,
        run_input=run_input, timezone=tz, overlap=overlap, catch_up=catch_up))
    typer.echo(f"schedule {_line(added)}")


@schedules_app.command("list")
def schedules_list() -> None:
    """The tenant's schedules, by name."""
    from pal.engine.schedules import list_schedules

    client = common.client()
    found = common.checked(lambda: list_schedules(client.runtime, client.settings.tenant))
    for schedule in found:
        typer.echo(_line(schedule))
    if not found:
        typer.echo("no schedules")


@schedules_app.command("pause")
def schedules_pause(name: str) -> None:
    """Pause: no tick runs until it is resumed."""
    from pal.engine.schedules import pause

    client = common.client()
    typer.echo(_line(common.checked(lambda: pause(client.runtime, client.settings.tenant, name))))


@schedules_app.command("resume")
def schedules_resume(name: str) -> None:
    """Resume from the next tick after now (the paused ticks are not run)."""
    from pal.engine.schedules import resume

    client = common.client()
    typer.echo(_line(common.checked(lambda: resume(client.runtime, client.settings.tenant, name))))


@schedules_app.command("delete")
def schedules_delete(name: str) -> None:
    """Delete the schedule; the runs it started stay."""
    from pal.engine.schedules import delete_schedule

    client = common.client()
    common.checked(lambda: delete_schedule(client.runtime, client.settings.tenant, name))
    typer.echo(f"schedule {name} deleted")
