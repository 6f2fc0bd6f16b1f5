"""The live journal: `GET /v1/runs/{run_id}/events` streams a run's events as Server-Sent Events
as they land, until the run's terminal event (or soon after the stream's token is revoked).

On Postgres a stream sleeps until pal.storage.notify's LISTEN connection says its run's journal grew,
and polls only as a fallback; on SQLite it polls."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, HTTPException, Query, Request
from sse_starlette.sse import EventSourceResponse

from pal.api.auth import Auth, Caller, tenant_of
from pal.api.deps import Notifier, Rt, own_run
from pal.core.vocabulary import TERMINAL_EVENT_KINDS
from pal.engine.runtime import Runtime
from pal.storage.notify import JournalNotifier

SSE_POLL_SECONDS = 0.2  # SQLite: how often a stream looks for new events
NOTIFY_FALLBACK_SECONDS = 2.0  # Postgres: streams wake on NOTIFY, and poll this often regardless
# An open stream re-checks its token at most this often (between polls): a revoked token's stream
# ends within about NOTIFY_FALLBACK_SECONDS instead of running as long as the run.
TOKEN_RECHECK_SECONDS = 1.0

router = APIRouter()


@router.get("/v1/runs/{run_id}/events")
async def events(run_id: str, caller: Auth, request: Request, rt: Rt, notifier: Notifier,
                 last_event_id: Annotated[str | None, Header()] = None,
                 after: Annotated[int | None, Query(ge=0)] = None) -> EventSourceResponse:
    """The journal as it lands (Server-Sent Events; `id` is the event's seq). `Last-Event-ID`
    (or `?after=`) resumes exactly after that event; the stream ends after the terminal event,
    or soon after its token is revoked."""
    await anyio.to_thread.run_sync(own_run, rt, run_id, caller)
    try:
        start = int(last_event_id) if last_event_id else (after or 0)
    except ValueError as exc:
        raise HTTPException(422, "Last-Event-ID must be an event seq (a whole number)") from exc
    token_live = functools.partial(_token_live, request, caller)
    return EventSourceResponse(_subscribed(rt, notifier, run_id, start, token_live))


def _token_live(request: Request, caller: Caller) -> bool:
    """Whether the stream's token still names its tenant (it may have been revoked since)."""
    return tenant_of(request, caller.token) == caller.tenant_id


async def _subscribed(rt: Runtime, notifier: JournalNotifier | None, run_id: str, after: int,
                      token_live: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
    """`journal_stream`, woken by the notifier while it runs; the subscription ends with the
    stream, however it ends (a client that goes away included)."""
    woken = notifier.subscribe(run_id) if notifier is not None else None
    try:
        async for item in journal_stream(rt, run_id, after, woken, token_live):
            yield item
    finally:
        if notifier is not None and woken is not None:
            notifier.unsubscribe(run_id, woken)


async def journal_stream(rt: Runtime, run_id: str, after: int, woken: asyncio.Event | None,
                         token_live: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
    """The run's events after seq `after` as SSE items, until its terminal event; with `woken`
    (set on NOTIFY) it waits for that instead of polling. Journal reads run in threads: they
    block, and the event loop serves every other stream."""
    last = after
    loop = asyncio.get_running_loop()
    recheck_at = loop.time() + TOKEN_RECHECK_SECONDS
    while True:
        if loop.time() >= recheck_at:
            if not await anyio.to_thread.run_sync(token_live):
                return  # revoked: a browser's EventSource reconnects and gets its 401
            recheck_at = loop.time() + TOKEN_RECHECK_SECONDS
        batch = await anyio.to_thread.run_sync(rt.control.events, run_id, last)
        for event in batch:
            last = event.seq
            yield {"id": str(event.seq), "event": event.kind, "data": json.dumps(event.as_dict())}
            if event.kind in TERMINAL_EVENT_KINDS:
                return
        if not batch and await _ended(rt, run_id, last):
            return
        await _wait_for_more(woken)


async def _ended(rt: Runtime, run_id: str, last: int) -> bool:
    """Whether the run is over and nothing came after `last`: a stream resumed after the terminal
    event would never see one. The second read catches events that landed after the batch's."""
    run = await anyio.to_thread.run_sync(rt.control.get_run, run_id)
    return run.terminal and not await anyio.to_thread.run_sync(rt.control.events, run_id, last)


async def _wait_for_more(woken: asyncio.Event | None) -> None:
    """Until the notifier wakes the stream (at most a fallback period), or one poll period."""
    if woken is None:
        await asyncio.sleep(SSE_POLL_SECONDS)
        return
    with contextlib.suppress(TimeoutError):  # a missed NOTIFY costs one fallback poll
        await asyncio.wait_for(woken.wait(), NOTIFY_FALLBACK_SECONDS)
    woken.clear()
