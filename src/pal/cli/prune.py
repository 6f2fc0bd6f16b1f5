"""`pal runs prune`: delete finished runs older than a cutoff, with everything of theirs, in batches
that are safe while workers run (docs/retention.md). Exit codes as pal.cli.common: 2 a bad cutoff
or batch, or --keep-receipts without PAL_SIGNING_KEY; 4 the journal failed (batches committed
before stay pruned; run it again to go on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from pal.cli import common

if TYPE_CHECKING:
    from pal.engine.retention import PruneTotals


def runs_prune(
    finished_before: Annotated[str, typer.Option(
        "--finished-before", help="Prune runs finished before this: 2030-01-31 (UTC midnight), "
                                  "2030-01-31T12:00:00+02:00 (UTC without an offset), or an age: 30d, 12h.")],
    keep_receipts: Annotated[bool, typer.Option(
        "--keep-receipts", help="Keep each run's signed receipt (needs PAL_SIGNING_KEY): "
                                "`pal receipts export` and the REST route still serve it.")] = False,
    batch: Annotated[int, typer.Option(help="Run families per transaction.")] = 500,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would go; write nothing.")] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's runs.")] = None,
    as_json: common.AsJson = False,
) -> None:
    """Delete finished runs (succeeded, failed, cancelled) finished before a cutoff, each with its
    child runs, journal, receipts and leases; never a run in flight or a family with one."""
    from pal.core.clock import utcnow
    from pal.engine.retention import check_batch, parse_cutoff, prune
    from pal.storage.retention import PruneQuery

    cutoff = common.checked(lambda: parse_cutoff(finished_before, utcnow()))
    common.checked(lambda: check_batch(batch))
    query = PruneQuery(cutoff, common.check_tenant(tenant) if tenant is not None else None, batch)
    client = common.client()
    verb = "would prune" if dry_run else "pruned"
    if not as_json:
        typer.echo(f"{'dry run: ' if dry_run else ''}pruning runs finished before {cutoff.isoformat()}"
                   f"{f' of tenant {tenant}' if tenant else ''}, {batch} families per batch")

    def progress(totals: PruneTotals) -> None:
        if not as_json:
            typer.echo(f"batch {totals.batches}: {verb} {totals.runs:,} runs, {totals.events:,} events "
                       f"so far ({_rate(totals.runs, totals.seconds)} runs/s, "
                       f"{_rate(totals.events, totals.seconds)} events/s)")

    totals = common.checked(lambda: prune(client.runtime, query, dry_run=dry_run, keep_receipts=keep_receipts,
                                          on_batch=progress))
    if as_json:
        common.print_json({"dry_run": dry_run, "finished_before": cutoff.isoformat(), "tenant": tenant,
                           "families": totals.families, "runs": totals.runs, "events": totals.events,
                           "receipts_kept": totals.receipts, "families_skipped": totals.skipped,
                           "batches": totals.batches, "seconds": round(totals.seconds, 3)})
        return
    typer.echo(f"{verb} {totals.families:,} run families ({totals.runs:,} runs, {totals.events:,} events"
               f"{f', {totals.receipts:,} receipts kept' if keep_receipts else ''}) in {totals.batches} "
               f"batches, {totals.seconds:.1f}s")
    if totals.skipped:
        typer.echo(f"passed over {totals.skipped:,} families with a run still in flight")


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}" if seconds > 0 else "-"
