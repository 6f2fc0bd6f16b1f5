"""`pal db` (the journal database) and `pal doctor` (its invariants)."""

from __future__ import annotations

from typing import Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_RUN_FAILED, EXIT_STORAGE
from pal.errors import PalError

db_app = typer.Typer(help="Journal database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply the journal schema migrations (idempotent)."""
    from pal.storage.database import shared_engine
    from pal.storage.schema.migrate import current_revision, upgrade

    settings = common.settings()
    engine = shared_engine(settings.database_url)
    try:
        upgrade(engine)
        typer.echo(f"journal at revision {current_revision(engine)} ({engine.url!r})")
    except Exception as exc:  # alembic and drivers raise their own types; show them plainly
        common.fail(f"migration failed: {exc}", EXIT_STORAGE)


@db_app.command("grant")
def db_grant(
    role: Annotated[str, typer.Argument(help="An existing Postgres role that owns nothing.")],
) -> None:
    """Grant ROLE the least privilege PAL's worker, beat and API need (run as the schema's owner)."""
    from pal.storage.database import shared_engine
    from pal.storage.schema.grants import grant_app_role

    try:
        statements = grant_app_role(shared_engine(common.settings().database_url), role)
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    except Exception as exc:  # the driver's own errors: show them plainly
        common.fail(f"grant failed: {exc}", EXIT_STORAGE)
    for statement in statements:
        typer.echo(statement)


def doctor(
    as_json: common.AsJson = False,
) -> None:
    """Check the journal against its invariants; exit 0 only when it is clean (1 otherwise)."""
    found = common.checked(lambda: common.client().runtime.control.violations())
    if as_json:
        common.print_json([v.as_dict() for v in found])
    else:
        for v in found:
            step = f" step {v.step_id}" if v.step_id else ""
            typer.echo(f"{v.kind}: run {v.run_id}{step}: {v.detail}")
        typer.echo("journal is clean" if not found else f"{len(found)} violation(s)")
    if found:
        raise typer.Exit(EXIT_RUN_FAILED)
