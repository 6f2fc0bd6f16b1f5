"""`pal runs approve|reject|approvals` and `pal approvals`: what waits for a person, shown in full
(prompt, the `show` payload, its hash), and the decision, journaled with who decided and why.

Like the other commands, these read and write the journal directly (PAL_DATABASE_URL), as the
operator; REST callers use /v1/approvals and /v1/runs/{id}/steps/{step}/approve (docs/api.md)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pal.cli import common
from pal.cli.common import EXIT_REFUSED
from pal.errors import PalError, Refused

if TYPE_CHECKING:
    from pal.client import Client
    from pal.core.records import RunRecord
    from pal.engine.waiting import PendingApproval

_COMMENT = typer.Option("--comment", "-m", help="Why; journaled with the decision (at most 2000 characters).")
_BY = typer.Option("--by", help="Who decides (default: $USER).")
_HASH = typer.Option("--hash", help="Refuse unless the pending approval's hash is this (what you reviewed).")


def decide_commands(run_id: str, step_id: str, approval_hash: str) -> list[str]:
    """The commands that decide one pending approval, ready to paste."""
    run, step = shlex.quote(run_id), shlex.quote(step_id)
    pinned = f" --hash {shlex.quote(approval_hash)}" if approval_hash else ""
    return [f"pal runs approve {run} {step}{pinned}", f"pal runs reject {run} {step}"]


def approval_lines(p: PendingApproval) -> list[str]:
    """One pending approval as a person reads it before deciding."""
    where = "" if p.depth == 0 else f"  (child run, depth {p.depth})"
    kind = f"  [{p.kind}]" if p.kind != "approval" else ""
    prompt = p.prompt if isinstance(p.prompt, str) else json.dumps(p.prompt, ensure_ascii=False, default=str)
    lines = [f"run {p.run_id} step {p.step_id} waits for a decision{kind}{where}",
             f"  prompt: {prompt}"]
    shown = json.dumps(p.show, indent=2, ensure_ascii=False, default=str).splitlines()
    lines += ["  show:", *("    " + line for line in shown)]
    lines.append(f"  hash: {p.approval_hash}" + (f"  expires {p.expires_at}" if p.expires_at else ""))
    commands = decide_commands(p.run_id, p.step_id, p.approval_hash)
    lines += [f"  approve: {commands[0]}", f"  reject:  {commands[1]}"]
    return lines


def approval_watcher(client: Client, run_id: str, emit: Callable[[str], None],
                     every: float = 1.0) -> Callable[[RunRecord], None]:
    """For `pal run`'s follow: while the run is parked, print each approval that starts waiting
    under it (its child runs' too), once."""
    shown: set[tuple[str, str, str]] = set()
    last = [0.0]

    def watch(run: RunRecord) -> None:
        if run.status != "waiting" or time.monotonic() - last[0] < every:
            return
        last[0] = time.monotonic()
        for p in client.pending_approvals(run_id):
            key = (p.run_id, p.step_id, p.approval_hash)
            if key not in shown:
                shown.add(key)
                for line in approval_lines(p):
                    emit(line)

    return watch


def _decide(run_id: str, step_id: str, decision: str, comment: str | None, by: str | None,
            expected_hash: str | None) -> None:
    client = common.client()
    try:
        outcome = client.decide(run_id, step_id, decision, comment=comment, by=by,
                                expected_hash=expected_hash)
    except Refused as exc:
        common.fail(str(exc), EXIT_REFUSED)
    except PalError as exc:
        common.fail(str(exc), common.exit_code(exc))
    after = "the run finished" if outcome.finished else (
        f"dispatched: {', '.join(outcome.dispatch)}" if outcome.dispatch else "the run waits for more")
    typer.echo(f"run {run_id} step {step_id}: {decision}; {after}")


def runs_approve(run_id: str, step_id: str,
                 comment: Annotated[str | None, _COMMENT] = None,
                 by: Annotated[str | None, _BY] = None,
                 expected_hash: Annotated[str | None, _HASH] = None) -> None:
    """Approve a waiting approval step (the run continues on its `approved` branch) or a budget
    pause (the step runs once past the budget)."""
    _decide(run_id, step_id, "approved", comment, by, expected_hash)


def runs_reject(run_id: str, step_id: str,
                comment: Annotated[str | None, _COMMENT] = None,
                by: Annotated[str | None, _BY] = None,
                expected_hash: Annotated[str | None, _HASH] = None) -> None:
    """Reject a waiting approval step (the `rejected` branch, or the run fails without one) or a
    budget pause (the run fails `budget_exceeded`)."""
    _decide(run_id, step_id, "rejected", comment, by, expected_hash)


def _print(pending: list[PendingApproval], as_json: bool, empty: str) -> None:
    if as_json:
        common.print_json([p.as_dict() for p in pending])
        return
    if not pending:
        typer.echo(empty)
    for i, p in enumerate(pending):
        if i:
            typer.echo("")
        for line in approval_lines(p):
            typer.echo(line)


def runs_approvals(run_id: str, as_json: common.AsJson = False) -> None:
    """List the run's pending approvals and budget pauses (its child runs' too): prompt, `show`
    payload, hash and the commands that decide each."""
    pending = common.checked(lambda: common.client().pending_approvals(run_id))
    _print(pending, as_json, f"no pending approvals under run {run_id}")


def approvals(
    tenant: Annotated[str | None, typer.Option(help="The tenant (default: PAL_TENANT).")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="At most this many parked runs, newest "
                                                            "first.")] = 100,
    as_json: common.AsJson = False,
) -> None:
    """List every pending approval of a tenant, each under the run that waits on it."""
    from pal.engine.waiting import tenant_approvals

    if tenant is not None:
        common.check_tenant(tenant)
    client = common.client()
    who = tenant if tenant is not None else client.settings.tenant
    pending: list[Any] = common.checked(lambda: tenant_approvals(client.runtime, who, limit))
    _print(pending, as_json, f"no pending approvals for tenant {who}")
