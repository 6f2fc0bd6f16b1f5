"""`pal.AsyncClient` in an asyncio app: runs started and awaited concurrently with a real worker,
a run's events followed as they are journaled, the event loop never blocked, errors as the
synchronous client raises them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import pal
from pal.client import RunTimeout
from pal.errors import RunNotFound
from tests.conftest import Backend
from tests.support.graphs import linear
from tests.support.processes import Processes
from tests.support.tools import calls


def test_an_asyncio_app_starts_waits_and_follows_runs(processes: Processes, postgres_backend: Backend,
                                                      tmp_path: Path) -> None:
    processes.worker("solo")
    ledgers = [tmp_path / f"calls-{n}.log" for n in range(10)]

    async def app() -> tuple[list[str], list[str], int]:
        ticks = 0

        async def ticker() -> None:  # other work of the app, which a blocked loop would starve
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        async with pal.AsyncClient(postgres_backend.settings) as client:
            beat = asyncio.create_task(ticker())
            run_ids = await asyncio.gather(*(client.start_run(linear(ledger, 3), {}) for ledger in ledgers))
            followed = [e.kind async for e in client.follow(run_ids[0])]
            finished = await asyncio.gather(*(client.wait(run_id, timeout=120) for run_id in run_ids))
            beat.cancel()
            return followed, [run.status for run in finished], ticks

    followed, statuses, ticks = asyncio.run(app())
    assert statuses == ["succeeded"] * len(ledgers)
    assert all(sorted(calls(ledger)) == ["s0", "s1", "s2"] for ledger in ledgers)
    assert followed[0] == "run_queued" and followed[-1] == "run_succeeded"
    assert followed.count("step_completed") == 5  # start, s0, s1, s2, out: each once, in order
    assert ticks > 0


def test_the_async_client_raises_what_the_client_raises(postgres_backend: Backend, tmp_path: Path) -> None:
    async def app() -> None:
        async with pal.AsyncClient(postgres_backend.settings) as client:
            with pytest.raises(RunNotFound):
                await client.get_run("run_nope")
            with pytest.raises(RunNotFound):
                await client.wait("run_nope", timeout=1)
            run_id = await client.start_run(linear(tmp_path / "calls.log", 1), {})  # no worker runs it
            with pytest.raises(RunTimeout, match="still"):
                await client.wait(run_id, timeout=0.5)

    asyncio.run(app())
