"""side_effect_receipts: claim a delivery before sending it, settle it after, read a run's
receipts (docs/side-effects.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pal.core.records import Fence, Receipt
from pal.core.vocabulary import ReceiptStatus
from pal.storage.base import json_safe
from pal.storage.primitives import Primitives
from pal.storage.schema import side_effect_receipts

_TARGET_CHARS = 2000  # what a receipt keeps of its target (a URL, a mail address)


class ReceiptStore(Primitives):
    def claim_receipt(self, fence: Fence, *, key: str, step_id: str, attempt: int, effect_kind: str,
                      target: str) -> Receipt:
        """Claim the delivery of one step attempt before sending it, fenced by generation.

        One INSERT … ON CONFLICT DO NOTHING decides: the caller that inserts owns the send;
        anyone else gets the existing receipt (delivered, failed, or claimed and in doubt)."""
        with self._tx() as conn:
            self._fence_or_lose(conn, fence)
            inserted = conn.execute(
                self._insert(side_effect_receipts).values(
                    idempotency_key=key, run_id=fence.run_id, step_id=step_id, attempt=attempt,
                    effect_kind=effect_kind, target=target[:_TARGET_CHARS], status=ReceiptStatus.CLAIMED,
                    response=None, created_at=fence.now, updated_at=fence.now,
                ).on_conflict_do_nothing().returning(side_effect_receipts.c.idempotency_key)
            ).first()
            row = conn.execute(
                sa.select(side_effect_receipts.c.status, side_effect_receipts.c.response)
                .where(side_effect_receipts.c.idempotency_key == key)
            ).one()
        return Receipt(status=row.status, response=row.response, new=inserted is not None)

    def settle_receipt(self, *, key: str, status: str, response: Any, now: datetime) -> None:
        """Record a claimed delivery's outcome. Not fenced: what happened is true whoever
        reports it, and a fenced-out worker's report saves the next one from doubt."""
        with self._tx() as conn:
            conn.execute(
                side_effect_receipts.update()
                .where(side_effect_receipts.c.idempotency_key == key,
                       side_effect_receipts.c.status == ReceiptStatus.CLAIMED)
                .values(status=status, response=json_safe(response), updated_at=now)
            )

    def receipts(self, run_id: str) -> list[dict[str, Any]]:
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(side_effect_receipts).where(side_effect_receipts.c.run_id == run_id)
                .order_by(side_effect_receipts.c.created_at)
            ).mappings()
            return [dict(r) for r in rows]
