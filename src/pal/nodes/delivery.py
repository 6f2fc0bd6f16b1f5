"""The receipt protocol shared by delivering nodes (connector, email).

Before sending, the node claims the attempt's `side_effect_receipts` row (its key is the step
attempt's idempotency key). Then:
  new claim            send, then settle the receipt as delivered (or failed) with the response;
  delivered receipt    a re-drive reached a delivery that already happened: return its response;
  failed receipt       the earlier send was refused for sure: raise the same error again;
  claimed, unsettled   in doubt: the send may have happened. If the receiver honours idempotency
                       keys, send again with the same key; otherwise journal it as in doubt and
                       fail the step with code `delivery_in_doubt` rather than risk a second delivery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pal import faults
from pal.errors import DeliveryError, DeliveryInDoubt
from pal.nodes.base import StepContext


def deliver(ctx: StepContext, effect_kind: str, target: str, idempotent_receiver: bool,
            send: Callable[[], Any]) -> Any:
    """Run `send` at most once per attempt (or again with the same key for idempotent receivers)."""
    receipts = ctx.need_receipts()
    receipt = receipts.claim(effect_kind, target)
    if receipt.status == "delivered":
        return {"delivered": True, "replayed": True, "response": receipt.response}
    if receipt.status == "failed":
        raise DeliveryError(f"{effect_kind} to {target} failed earlier: {receipt.response}")
    if not receipt.new and not idempotent_receiver:
        receipts.in_doubt({"idempotency_key": ctx.idempotency_key, "effect_kind": effect_kind,
                           "target": target})
        raise DeliveryInDoubt(
            f"{effect_kind} to {target} was claimed (key {ctx.idempotency_key[:12]}…) but never "
            "confirmed: it may have been delivered, and the receiver does not declare that it "
            "honours idempotency keys, so PAL will not send it again. Check the receiver, then "
            "re-run the step by hand if it was not delivered."
        )
    faults.point("after_receipt_claim", ctx.step_id)
    try:
        response = send()
    except DeliveryError as exc:
        if exc.definitely_not_sent:
            receipts.settle("failed", {"error": str(exc)})
            raise
        if idempotent_receiver:
            raise  # the receipt stays claimed; a re-drive of this attempt re-sends with the key
        receipts.in_doubt({"idempotency_key": ctx.idempotency_key, "effect_kind": effect_kind,
                           "target": target, "error": str(exc)})
        raise DeliveryInDoubt(f"{effect_kind} to {target}: outcome unknown ({exc}); the receiver "
                              "does not declare that it honours idempotency keys, so PAL will "
                              "not send it again") from exc
    faults.point("after_delivery", ctx.step_id)
    receipts.settle("delivered", response)
    return {"delivered": True, "replayed": False, "response": response}
