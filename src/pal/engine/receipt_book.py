"""The ReceiptBook a step attempt's deliveries use (pal.nodes.base): side_effect_receipts rows in
the journal, keyed by the attempt's idempotency key, fenced by its generation."""

from __future__ import annotations

from typing import Any

from pal.core.clock import utcnow
from pal.core.records import Receipt
from pal.core.redact import redact, redact_text
from pal.core.secrets import scrub_known
from pal.engine.runtime import Runtime


class JournalReceipts:
    """The ReceiptBook of one step attempt: side_effect_receipts rows keyed by its idempotency key."""

    def __init__(self, rt: Runtime, ctx_key: str, run_id: str, step_id: str, attempt: int,
                 generation: int) -> None:
        self._rt, self._key = rt, ctx_key
        self._run_id, self._step_id, self._attempt, self._generation = run_id, step_id, attempt, generation

    # What a receipt records is redacted (pal.core.redact): a target URL may carry credentials.
    def claim(self, effect_kind: str, target: str) -> Receipt:
        return self._rt.journal.receipts.claim_receipt(
            self._rt.fence(self._run_id, self._generation), key=self._key, step_id=self._step_id,
            attempt=self._attempt, effect_kind=effect_kind, target=redact_text(target))

    def settle(self, status: str, response: Any) -> None:
        # An error's text is redacted; a delivered response is the step's own data, so only the
        # secret values a receiver may echo are replaced, as in the step's output.
        response = redact(response) if status != "delivered" else scrub_known(response)
        self._rt.journal.receipts.settle_receipt(key=self._key, status=status, response=response,
                                                 now=utcnow())

    def in_doubt(self, detail: Any) -> None:
        self._rt.journal.steps.mark_in_doubt(self._rt.fence(self._run_id, self._generation), self._step_id,
                                             self._attempt, redact(detail))
