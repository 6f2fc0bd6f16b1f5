"""`pal tokens ...`: the control plane's bearer tokens."""

from __future__ import annotations

from typing import Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_NOT_FOUND
from pal.errors import PalError

tokens_app = typer.Typer(help="Bearer tokens of the control plane (`pal api`).", no_args_is_help=True)


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option(help="The tenant whose runs the token may see and start.")],
    name: Annotated[str, typer.Option(help="A label, e.g. who or what uses it.")] = "default",
) -> None:
    """Create a token; its secret is printed once (only a hash is stored)."""
    from pal.core.clock import utcnow

    common.check_tenant(tenant)
    try:
        token_id, secret = common.client().runtime.control.create_token(tenant_id=tenant, name=name[:128],
                                                                  now=utcnow())
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    typer.echo(f"token {token_id} for tenant {tenant} (store the secret now; it is not shown again):")
    typer.echo(secret)
    own = common.settings().tenant
    if own != tenant:  # on stderr: scripts read the secret from the last line of stdout
        typer.echo(f"note: this token sees tenant {tenant!r}'s runs only; runs started from this shell "
                   f"go to tenant {own!r} (PAL_TENANT): start them with PAL_TENANT={tenant} or "
                   f"tenant_id={tenant!r} to see them with it", err=True)


@tokens_app.command("revoke")
def tokens_revoke(token_id: str) -> None:
    """Revoke a token at once."""
    from pal.core.clock import utcnow

    if not common.client().runtime.control.revoke_token(token_id=token_id, now=utcnow()):
        common.fail(f"no live token {token_id!r}", EXIT_NOT_FOUND)
    typer.echo(f"token {token_id} revoked")


@tokens_app.command("list")
def tokens_list() -> None:
    """List tokens (never their secrets)."""
    for row in common.client().runtime.control.list_tokens():
        state = f"revoked {row['revoked_at']:%Y-%m-%d %H:%M}" if row["revoked_at"] else "live"
        typer.echo(f"{row['id']}  tenant {row['tenant_id']}  {row['name']}  {state}")
