"""Receipts of finished runs as a service: the keys from the settings, issuing a run's bundle from
the journal, and checking a bundle against the live journal (docs/receipts.md). The format and
its checks are pure, in pal.core.run_receipt and pal.core.dsse.

Issuing computes the bundle from the journal each time (nothing is stored): a finished run's
events never change, and Ed25519 signs deterministically, so the same run gives the same bytes.
"""

from __future__ import annotations

from pal.config import Settings
from pal.core import dsse
from pal.core.run_receipt import ReceiptInvalid, Verified, check_chain, event_fields, issue
from pal.core.vocabulary import TERMINAL_STATUSES
from pal.engine.runtime import Runtime
from pal.errors import ConfigError, ReceiptsOff, Refused, RunNotFound
from pal.storage.database import create_engine
from pal.storage.journal import Journal

RECEIPTS_OFF = "receipts are off: set PAL_SIGNING_KEY (`pal receipts keygen` makes one)"


def signing_key(settings: Settings) -> dsse.SigningKey:
    """The key receipts are signed with; ReceiptsOff without PAL_SIGNING_KEY, ConfigError for a
    value that is not a key (never echoed: it is a secret)."""
    if not settings.signing_key:
        raise ReceiptsOff(RECEIPTS_OFF)
    try:
        return dsse.SigningKey(dsse.read_private_key(settings.signing_key))
    except dsse.UnreadableKey as exc:
        raise ConfigError(f"PAL_SIGNING_KEY: {exc}") from None


def trusted_keys(settings: Settings) -> list[dsse.TrustedKey]:
    """The public keys receipts may be signed with: the signing key's, then PAL_TRUSTED_KEYS (keys
    retired by a rotation, whose receipts still verify)."""
    keys = [signing_key(settings).trusted] if settings.signing_key else []
    for number, text in enumerate(settings.trusted_keys, start=1):
        try:
            key = dsse.trusted_key(text)
        except dsse.UnreadableKey as exc:
            raise ConfigError(f"PAL_TRUSTED_KEYS, entry {number}: {exc}") from None
        if all(k.key_id != key.key_id for k in keys):
            keys.append(key)
    return keys


def issue_receipt(journal: Journal, settings: Settings, run_id: str, tenant_id: str | None = None) -> bytes:
    """The receipt bundle of a finished run (of `tenant_id`'s runs, when given): RunNotFound,
    Refused while the run is in flight, ReceiptsOff. A run pruned with --keep-receipts answers
    the bundle kept when it was deleted, signing key or not (docs/retention.md)."""
    try:
        run = journal.runs.get_run(run_id, tenant_id=tenant_id)
    except RunNotFound:
        return _kept(journal, run_id, tenant_id)
    key = signing_key(settings)
    if run.status not in TERMINAL_STATUSES:
        raise Refused(f"run {run_id} is {run.status}: its receipt is issued once it has finished")
    events = journal.runs.events(run_id)
    if not events:  # pruned between the two reads: a finished run's journal goes all at once
        return _kept(journal, run_id, tenant_id)
    return issue(run, events, key)


def _kept(journal: Journal, run_id: str, tenant_id: str | None) -> bytes:
    kept = journal.retention.pruned_receipt(run_id, tenant_id=tenant_id)
    if kept is None:
        raise RunNotFound(f"no run {run_id!r}")
    return kept


def check_live(journal: Journal, verified: Verified) -> None:
    """A verified bundle against the journal as it is now: ReceiptInvalid("chain_mismatch") when
    the run's status or any of its events differs from what was signed."""
    run = journal.runs.get_run(verified.run_id)
    if run.status != verified.status:
        raise ReceiptInvalid("chain_mismatch", f"the journal says run {run.id} is {run.status}; the "
                                               f"receipt signed {verified.status}")
    from_journal = [event_fields(e) for e in journal.runs.events(run.id)]
    try:
        check_chain(run.id, verified.status, verified.statement["predicate"]["journal"], from_journal,
                    verified.links if len(from_journal) == len(verified.links) else None)
    except ReceiptInvalid as exc:
        raise ReceiptInvalid("chain_mismatch", f"the live journal differs from the receipt: {exc}") from None


def receipt_bundle(rt: Runtime, run_id: str, tenant_id: str | None = None) -> bytes:
    """The signed receipt of a finished run, as the API and `pal receipts export` hand it out."""
    return issue_receipt(rt.journal, rt.settings, run_id, tenant_id)


def check_live_at(database_url: str, verified: Verified) -> None:
    """A verified receipt against the journal at `database_url` as it is now (`pal receipts
    verify --database-url`): ReceiptInvalid("chain_mismatch") when they differ."""
    engine = create_engine(database_url)
    try:
        check_live(Journal(engine), verified)
    finally:
        engine.dispose()
