"""Side-effect receipts: one claim per key (everyone else reads the first claim's state), and
only a claimed receipt is settled."""

from __future__ import annotations

import pytest

from pal.core.records import ClaimOutcome, Receipt
from pal.core.vocabulary import ReceiptStatus
from pal.errors import LeaseLost
from pal.storage.journal import Journal
from tests.storage.kit import at, fence, new_run


@pytest.fixture
def started_step(journal: Journal) -> Journal:
    """r1 with step `send` started (attempt 1, generation 1)."""
    new_run(journal)
    assert journal.steps.claim_step(fence(), "send").outcome is ClaimOutcome.RUN
    return journal


def claim(journal: Journal, key: str = "k1", *, worker: str = "w1", seconds: float = 1.0,
          generation: int = 1) -> Receipt:
    return journal.receipts.claim_receipt(fence(generation=generation, worker=worker, seconds=seconds), key=key,
                                          step_id="send", attempt=1, effect_kind="email", target="ops@example.com")


def test_a_receipt_is_claimed_once_per_key(started_step: Journal) -> None:
    journal = started_step
    assert claim(journal) == Receipt(status=ReceiptStatus.CLAIMED, response=None, new=True)
    assert claim(journal, worker="w2", seconds=2) == Receipt(ReceiptStatus.CLAIMED, None, new=False)
    assert claim(journal, "k2", seconds=3).new
    [first, second] = journal.receipts.receipts("r1")
    assert (first["idempotency_key"], first["created_at"], first["target"]) == ("k1", at(1), "ops@example.com")
    assert second["idempotency_key"] == "k2"


def test_a_later_caller_gets_the_first_claims_outcome(started_step: Journal) -> None:
    journal = started_step
    assert claim(journal).new
    journal.receipts.settle_receipt(key="k1", status=ReceiptStatus.DELIVERED, response={"id": "m-1"}, now=at(5))
    assert claim(journal, seconds=6) == Receipt(ReceiptStatus.DELIVERED, {"id": "m-1"}, new=False)
    [row] = journal.receipts.receipts("r1")
    assert (row["status"], row["updated_at"]) == (ReceiptStatus.DELIVERED, at(5))


def test_only_a_claimed_receipt_is_settled(started_step: Journal) -> None:
    journal = started_step
    assert claim(journal).new
    journal.receipts.settle_receipt(key="k1", status=ReceiptStatus.FAILED, response={"smtp": 550}, now=at(5))
    journal.receipts.settle_receipt(key="k1", status=ReceiptStatus.DELIVERED, response={"id": "late"}, now=at(6))
    journal.receipts.settle_receipt(key="nobody", status=ReceiptStatus.DELIVERED, response=None, now=at(6))
    [row] = journal.receipts.receipts("r1")
    assert (row["status"], row["response"], row["updated_at"]) == (ReceiptStatus.FAILED, {"smtp": 550}, at(5))


def test_a_fenced_out_receipt_claim_raises_lease_lost_and_claims_nothing(started_step: Journal) -> None:
    journal = started_step
    with pytest.raises(LeaseLost):
        claim(journal, generation=2)
    assert journal.receipts.receipts("r1") == []
    assert claim(journal).new  # the key is still free for the lease's holder
