"""Receipts over a real journal (pal.engine.run_receipts): Postgres and SQLite give the same chain
head for the same events, an in-flight run has none, and a bundle checked against the live journal
catches an event or a status changed in the database afterwards (docs/receipts.md)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pal.config import load_settings
from pal.core import dsse
from pal.core.run_receipt import ReceiptInvalid, verify
from pal.engine.run_receipts import check_live, issue_receipt, trusted_keys
from pal.errors import ConfigError, ReceiptsOff, Refused, RunNotFound
from pal.storage.journal import Journal
from pal.storage.schema import journal_events, runs
from tests.storage import kit
from tests.storage.kit import fence, new_run

KEY = dsse.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
SETTINGS = load_settings({"PAL_SIGNING_KEY": dsse.private_text(KEY.private)})
# JSONB keeps numbers as numerics and reorders keys; SQLite keeps the text: the chain must not care.
OUTPUT: dict[str, Any] = {"z": 1.0, "a": [1e21, 0.1, "caf\u00e9\n\u2028", {"b": 2, "a": None}], "n": 2**60,
                          "\U0001f600": True, "\uffff": -0.5}
HEAD = "c56bb7840e403e2ae3698f8301af1fddd0fa418c1e3fe59fc7fad6005be176e1"


def finished_run(journal: Journal) -> None:
    new_run(journal)
    f = fence(seconds=1.5)
    claim = journal.steps.claim_step(f, "a")
    journal.steps.complete_step(f, "a", claim.attempt, OUTPUT, plan=kit.finishing({"done": 1.5}))


def test_postgres_and_sqlite_give_the_same_chain_head_for_the_same_events(journal: Journal) -> None:
    finished_run(journal)
    verified = verify(issue_receipt(journal, SETTINGS, "r1"), trusted_keys(SETTINGS))
    assert (verified.status, verified.count) == ("succeeded", 4)
    assert verified.head == HEAD  # the same constant on both backends


def test_no_receipt_while_a_run_is_in_flight_or_for_another_tenant_or_without_a_key(journal: Journal) -> None:
    new_run(journal)
    with pytest.raises(Refused, match="run r1 is queued: its receipt is issued once it has finished"):
        issue_receipt(journal, SETTINGS, "r1")
    with pytest.raises(RunNotFound):
        issue_receipt(journal, SETTINGS, "r1", tenant_id="t2")
    with pytest.raises(ReceiptsOff, match="receipts are off: set PAL_SIGNING_KEY"):
        issue_receipt(journal, load_settings({}), "r1")


def test_a_bad_signing_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        trusted_keys(load_settings({"PAL_SIGNING_KEY": "c2VjcmV0LXNlY3JldA=="}))
    assert "c2VjcmV0" not in str(refused.value) and "PAL_SIGNING_KEY" in str(refused.value)
    with pytest.raises(ConfigError, match="PAL_TRUSTED_KEYS, entry 2"):
        trusted_keys(load_settings({"PAL_TRUSTED_KEYS": f"{dsse.public_text(KEY.public)},nope"}))
    assert "c2VjcmV0" not in repr(load_settings({"PAL_SIGNING_KEY": "c2VjcmV0LXNlY3JldA=="}))


@pytest.mark.parametrize("change", ["payload", "status", "deleted"])
def test_the_live_journal_is_checked_against_the_receipt(journal: Journal, change: str) -> None:
    finished_run(journal)
    verified = verify(issue_receipt(journal, SETTINGS, "r1"), trusted_keys(SETTINGS))
    check_live(journal, verified)  # unchanged: holds
    completed = kit.events(journal, kind="step_completed")[0]
    with journal.engine.begin() as conn:
        if change == "payload":
            conn.execute(sa.update(journal_events).where(journal_events.c.seq == completed.seq)
                         .values(payload={"output": "forged"}))
        elif change == "status":
            conn.execute(sa.update(runs).where(runs.c.id == "r1").values(status="failed"))
        else:
            conn.execute(sa.delete(journal_events).where(journal_events.c.seq == completed.seq))
    with pytest.raises(ReceiptInvalid) as refused:
        check_live(journal, verified)
    assert refused.value.reason == "chain_mismatch"
    assert {"payload": f"event seq {completed.seq} (step_completed of step 'a') is not the event",
            "status": "the journal says run r1 is failed; the receipt signed succeeded",
            "deleted": "3 events, but the receipt signed 4: an event was deleted"}[change] in str(refused.value)
    with journal.engine.begin() as conn:  # put it back for the fixture's closing `pal doctor`
        if change == "payload":
            conn.execute(sa.update(journal_events).where(journal_events.c.seq == completed.seq)
                         .values(payload=completed.payload))
        elif change == "status":
            conn.execute(sa.update(runs).where(runs.c.id == "r1").values(status="succeeded"))
        else:
            conn.execute(sa.insert(journal_events).values(
                seq=completed.seq, run_id="r1", step_id="a", attempt=completed.attempt, kind=completed.kind,
                payload=completed.payload, generation=completed.generation, created_at=completed.created_at))
