"""`pal runs retry` and `pal runs fork`: a new run derived from a finished one, reusing its completed
steps (docs/retry-and-fork.md); then follow it as `pal run` does. Exit codes as pal.cli.common:
2 a bad input or step, 3 no such run, 6 refused (the source's state, a run id in use, the quota)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_RUN_FAILED, EXIT_TIMEOUT

if TYPE_CHECKING:
    from pal.client import Client

_RUN_ID = typer.Option("--run-id", help="Your own id for the new run (the same id and request again "
                                         "give the same run; other work under it exits 6).")
_FOLLOW = typer.Option(help="Show the new run's steps live until it ends.")
_TIMEOUT = typer.Option(help="Seconds to follow before giving up (exit 5).")


def runs_retry(
    run_id: Annotated[str, typer.Argument(help="A failed or cancelled run.")],
    graph: Annotated[Path | None, typer.Option(
        "--graph", help="A fixed graph (JSON or YAML file) to run instead: every node a completed step "
                        "ran must be in it unchanged.")] = None,
    new_run_id: Annotated[str | None, _RUN_ID] = None,
    follow: Annotated[bool, _FOLLOW] = True,
    timeout: Annotated[float, _TIMEOUT] = 300.0,
) -> None:
    """Retry a failed or cancelled run as a new run: its completed steps are reused (never run
    again), its failed and unfinished steps run again (with --graph, as that fixed graph says)."""
    document = None if graph is None else common.read_graph(graph)
    client = common.client()
    _derive(client, lambda: client.retry_run(run_id, new_run_id=new_run_id, graph=document), run_id, "retry",
            follow, timeout)


def runs_fork(
    run_id: Annotated[str, typer.Argument(help="A finished run.")],
    from_step: Annotated[str, typer.Option("--from", help="The graph node to run again from.")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="The new run's input, JSON "
                                                                    "(default: the source run's).")] = None,
    new_run_id: Annotated[str | None, _RUN_ID] = None,
    follow: Annotated[bool, _FOLLOW] = True,
    timeout: Annotated[float, _TIMEOUT] = 300.0,
) -> None:
    """Fork a finished run as a new run from step FROM on: the completed steps that are neither FROM
    nor downstream of it are reused, FROM and what follows run (with --input, on the new input)."""
    from pal.engine.lineage import SAME_INPUT

    new_input = SAME_INPUT if input is None else common.read_json(input, "--input")
    client = common.client()
    _derive(client, lambda: client.fork_run(run_id, from_step, new_input, new_run_id=new_run_id), run_id,
            "fork", follow, timeout)


def _derive(client: Client, create: Callable[[], str], source: str, kind: str, follow: bool,
            timeout: float) -> None:
    from pal.cli.progress import console, describe
    from pal.cli.progress import follow as follow_run

    new_id = common.checked(create)
    out = console()
    out.print(f"run {new_id} queued ({kind} of run {source})")
    if not follow:
        out.print(f"follow it with: pal runs events {new_id} --follow")
        return
    final = follow_run(lambda seq: client.events(new_id, seq), lambda: client.get_run(new_id),
                       lambda e: out.print("  " + describe(e)), timeout=timeout)
    if final is None:
        common.fail(f"run {new_id} not finished after {timeout:g}s (is a worker running?)", EXIT_TIMEOUT)
    out.print(f"run {new_id} {final.status}")
    if final.status != "succeeded":
        raise typer.Exit(EXIT_RUN_FAILED)
