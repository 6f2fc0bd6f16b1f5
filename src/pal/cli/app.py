"""The `pal` command line: the root command and where each command lives.

    pal db upgrade|grant, pal doctor          pal.cli.db
    pal run, pal runs ..., pal anomalies      pal.cli.runs
    pal runs retry|fork                       pal.cli.lineage
    pal runs prune                            pal.cli.prune
    pal runs approve|reject|approvals, pal approvals   pal.cli.approvals
    pal tokens ...                            pal.cli.tokens
    pal schedules ...                         pal.cli.schedules
    pal receipts ...                          pal.cli.receipts
    pal worker|beat|api|flower                pal.cli.servers
    pal demo                                  pal.cli.demo

Exit codes are listed in pal.cli.common. A command loads the machinery it needs when it runs.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from pal.cli import approvals, db, demo, lineage, prune, receipts, runs, schedules, servers, tokens
from pal.cli.common import EXIT_BAD_INPUT, exit_code
from pal.core.extras import missing_extra
from pal.core.redact import install_log_redaction
from pal.errors import PalError

app = typer.Typer(help="PAL: durable AI-agent graphs on Celery.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


def _print_version(wanted: bool) -> None:
    if wanted:
        try:
            typer.echo(f"pal {version('pal')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("pal (not installed: version unknown)")
        raise typer.Exit()


@app.callback()
def root(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print PAL's version and exit.")] = False,
) -> None:
    """PAL: durable AI-agent graphs on Celery."""


app.add_typer(db.db_app, name="db")
runs.runs_app.command("retry")(lineage.runs_retry)
runs.runs_app.command("fork")(lineage.runs_fork)
runs.runs_app.command("prune")(prune.runs_prune)
app.add_typer(runs.runs_app, name="runs")
app.add_typer(tokens.tokens_app, name="tokens")
app.add_typer(schedules.schedules_app, name="schedules")
app.add_typer(receipts.receipts_app, name="receipts")
for command in (servers.worker, servers.beat, runs.run, servers.api, db.doctor, servers.flower,
                demo.demo):
    app.command()(command)
app.command("anomalies")(runs.runs_anomalies)  # `pal anomalies` = `pal runs anomalies`
runs.runs_app.command("approve")(approvals.runs_approve)
runs.runs_app.command("reject")(approvals.runs_reject)
runs.runs_app.command("approvals")(approvals.runs_approvals)
app.command("approvals")(approvals.approvals)  # every pending approval of a tenant


def main() -> None:
    install_log_redaction(whole_process=True)  # a `pal` process is PAL's own: every record (pal.core.redact)
    try:
        app()
    except PalError as exc:  # anything not mapped by a command: a clean message, not a trace
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exit_code(exc))
    except ModuleNotFoundError as exc:  # an optional part this command needs (pal.core.extras)
        missing = missing_extra(exc, "this command")
        if missing is None:
            raise
        typer.echo(f"error: {missing}", err=True)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
