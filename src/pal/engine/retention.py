"""Retention as a service (docs/retention.md): read the cutoff, then prune finished run families
batch by batch (pal.storage.retention), each batch its own short transaction so workers go on
between them; with `keep_receipts`, each run's signed receipt is issued and kept as it is deleted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from pal.config import Settings
from pal.core.clock import utcnow
from pal.core.records import Event, RunRecord
from pal.core.run_filters import parse_time
from pal.core.run_receipt import issue
from pal.engine.run_receipts import signing_key
from pal.engine.runtime import Runtime
from pal.errors import InputError
from pal.storage.journal import Journal
from pal.storage.retention import PruneBatch, PruneQuery, Sign

MAX_BATCH = 10_000  # families per transaction: past this a batch holds its locks too long
MAX_CUTOFF_CHARS = 64
_AGO = re.compile(r"(\d{1,6})([dh])")
_UNIT = {"d": timedelta(days=1), "h": timedelta(hours=1)}
CUTOFF_FORMS = "an ISO 8601 date (2030-01-31), a date and time (2030-01-31T12:00:00+02:00, UTC without an " \
               "offset), or an age: Nd or Nh (30d: finished more than 30 days ago)"


@dataclass(frozen=True)
class PruneTotals:
    """What a prune did so far (a dry run: would do)."""

    families: int = 0
    runs: int = 0
    events: int = 0
    receipts: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0

    def add(self, batch: PruneBatch, seconds: float) -> PruneTotals:
        return replace(self, families=self.families + batch.families, runs=self.runs + batch.runs,
                       events=self.events + batch.events, receipts=self.receipts + batch.receipts,
                       skipped=self.skipped + batch.skipped, batches=self.batches + 1, seconds=seconds)


def parse_cutoff(text: str, now: datetime) -> datetime:
    """The instant `text` names (see CUTOFF_FORMS); InputError for anything else."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_CUTOFF_CHARS:
        raise InputError(f"--finished-before must be {CUTOFF_FORMS}")
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago is not None:
        try:
            return now - int(ago.group(1)) * _UNIT[ago.group(2)]
        except OverflowError:  # before year 1
            raise InputError(f"--finished-before {text!r} is before year 1; use {CUTOFF_FORMS}") from None
    try:  # the same ISO 8601 reading as the runs list's since/until (pal.core.run_filters)
        return parse_time(text, "--finished-before")
    except ValueError:
        raise InputError(f"--finished-before {text!r} is not {CUTOFF_FORMS}") from None


def check_batch(batch: int) -> int:
    if not 1 <= batch <= MAX_BATCH:
        raise InputError(f"--batch must be between 1 and {MAX_BATCH} families per transaction")
    return batch


def prune_runs(journal: Journal, settings: Settings, query: PruneQuery, *, dry_run: bool = False,
               keep_receipts: bool = False,
               on_batch: Callable[[PruneTotals], None] | None = None) -> PruneTotals:
    """Prune every finished family of `query` (see pal.storage.retention), reporting after each
    batch. ReceiptsOff when `keep_receipts` has no signing key: checked before anything is read."""
    check_batch(query.batch)
    sign: Sign | None = None
    if keep_receipts:
        key = signing_key(settings)

        def sign(run: RunRecord, events: list[Event]) -> bytes:
            return issue(run, events, key)

    started, totals, cursor = time.monotonic(), PruneTotals(), None
    while True:
        batch = journal.retention.prune_batch(query, after=cursor, now=utcnow(), dry_run=dry_run, sign=sign)
        if batch.cursor is None:
            return totals
        totals, cursor = totals.add(batch, time.monotonic() - started), batch.cursor
        if on_batch is not None:
            on_batch(totals)


def prune(rt: Runtime, query: PruneQuery, *, dry_run: bool = False, keep_receipts: bool = False,
          on_batch: Callable[[PruneTotals], None] | None = None) -> PruneTotals:
    """`prune_runs` on the runtime's journal (`pal runs prune`)."""
    return prune_runs(rt.journal, rt.settings, query, dry_run=dry_run, keep_receipts=keep_receipts,
                      on_batch=on_batch)
