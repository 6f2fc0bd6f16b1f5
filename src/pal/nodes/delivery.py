"""The receipt protocol shared by delivering nodes (connector, email).

Before sending, the node claims the attempt's `side_effect_receipts` row (its key is the step
attempt's idempotency key). Then:
  new claim            send, then settle the receipt as delivered (or failed) with the response;
  delivered receipt    a re-drive reached a delivery that already happened: return its response;
  failed receipt       the earlier send was refused for sure: raise the same error again;
  claimed, unsettled   in doubt: the send may have happened. If the receiver honours idempotency
                       keys, send again with the same key; otherwise journal it as in doubt and
                       fail the step with code `delivery_in_doubt` rather than risk a second delivery.
The same holds within one invocation when a send breaks off with its outcome unknown.

The claim is made where the step runs (`delivery`, a journal call in the worker's thread); the send
is awaited (on the worker's event loop, pal.engine.async_steps), so a delivery that waits on its
receiver holds no worker thread. The receipt's settlement, a journal call, runs off the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

from pal.core import faults
from pal.errors import DeliveryError, DeliveryInDoubt
from pal.nodes.base import StepContext

RESEND_PAUSES_S = (0.2, 0.5, 1.0)  # an idempotent receiver whose answer was lost: same key again

Delivered = dict[str, Any]


def delivery(ctx: StepContext, effect_kind: str, target: str, idempotent_receiver: bool,
             send: Callable[[], Awaitable[Any]]) -> Coroutine[Any, Any, Delivered]:
    """Claim this attempt's receipt now, then return the delivery to await: `send` at most once
    per attempt (or again with the same key for idempotent receivers).

    Only a failure that proves nothing was delivered (refused connection, a 4xx answer, refused
    recipients) settles the receipt `failed` and may be retried, as a new attempt with a new key.
    Any other failure once the send has begun (a timeout, a dropped connection, a 5xx, a journal
    error while settling) leaves the outcome unknown: an idempotent receiver gets the same key
    again, a few times, within this attempt; otherwise the step fails in doubt, never retried."""
    receipts = ctx.need_receipts()
    receipt = receipts.claim(effect_kind, target)
    if receipt.status == "delivered":
        return _ready({"delivered": True, "replayed": True, "response": receipt.response})
    if receipt.status == "failed":
        raise DeliveryError(f"{effect_kind} to {target} failed earlier: {receipt.response}")
    if not receipt.new and not idempotent_receiver:
        _in_doubt(ctx, effect_kind, target, "claimed but never confirmed (the worker stopped mid-delivery)")
    faults.point("after_receipt_claim", ctx.step_id, ctx.run_id)
    return _send(ctx, effect_kind, target, 1 + (len(RESEND_PAUSES_S) if idempotent_receiver else 0), send)


async def _ready(value: Delivered) -> Delivered:
    return value


async def _send(ctx: StepContext, effect_kind: str, target: str, attempts: int,
                send: Callable[[], Awaitable[Any]]) -> Delivered:
    receipts = ctx.need_receipts()
    last: BaseException | None = None
    for round_ in range(attempts):
        if round_:
            await asyncio.sleep(RESEND_PAUSES_S[round_ - 1])
        try:
            response = await send()
        except DeliveryError as exc:
            if exc.definitely_not_sent:
                await asyncio.to_thread(receipts.settle, "failed", {"error": str(exc)})
                raise
            last = exc
            continue
        except Exception as exc:  # anything else after the send began: the outcome is unknown
            last = exc
            continue
        faults.point("after_delivery", ctx.step_id, ctx.run_id)
        try:
            await asyncio.to_thread(receipts.settle, "delivered", response)
        except Exception as exc:  # delivered, but not recorded: a retry must not send again
            _in_doubt(ctx, effect_kind, target, f"delivered, but its receipt could not be settled: {exc}",
                      record=False)
        return {"delivered": True, "replayed": False, "response": response}
    why = f"outcome unknown: {type(last).__name__}: {last}"
    await asyncio.to_thread(_in_doubt, ctx, effect_kind, target, why)
    raise AssertionError("unreachable")  # _in_doubt raises


def _in_doubt(ctx: StepContext, effect_kind: str, target: str, why: str, *, record: bool = True) -> NoReturn:
    """Journal `step_in_doubt` (when the journal can take it) and fail the step, not retryable."""
    if record:
        ctx.need_receipts().in_doubt({"idempotency_key": ctx.idempotency_key, "effect_kind": effect_kind,
                                      "target": target, "why": why})
    raise DeliveryInDoubt(
        f"{effect_kind} to {target} is in doubt (key {ctx.idempotency_key[:12]}…): {why}. It may have "
        "been delivered, and PAL will not send it again: check the receiver, and start the work "
        "again by hand if it did not arrive. (Declare idempotentReceiver: true for a receiver that "
        "de-duplicates by Idempotency-Key, and PAL re-sends with the same key instead.)")
