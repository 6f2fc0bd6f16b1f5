"""Admission over real workers, beat, Postgres and Redis: with PAL_TENANT_CONCURRENCY, one tenant's
flood is held while another tenant's run goes through; a graph's concurrency key keeps its runs one
at a time across two workers and a SIGKILL, while another key's run goes on; held runs start in
priority order; a bad concurrency key or priority is refused with nothing written."""

from __future__ import annotations

import dataclasses
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.config.admission import load_admission
from pal.engine.recovery import ResumeRefused, resume
from pal.errors import InputError
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.processes import Processes


def napping_graph(seconds: float, **extra: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "nap", "type": "tool", "data": {"tool": "nap", "args": {"seconds": seconds}}},
                      {"id": "out", "type": "output", "data": {"value": "{{ input }}"}}],
            "edges": [{"source": "t", "target": "nap"}, {"source": "nap", "target": "out"}]} | extra


def limited_client(backend: Backend, limit: str) -> Client:
    settings = dataclasses.replace(backend.settings,
                                   admission=load_admission({"PAL_TENANT_CONCURRENCY": limit}))
    return Client(settings)


def span(client: Client, run_id: str) -> tuple[datetime, datetime]:
    """From the run's first step start to its end."""
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded", run.error
    first = min(e.created_at for e in client.events(run_id) if e.kind == "step_started")
    assert run.finished_at is not None
    return first, run.finished_at


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    moments = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in moments:
        running += change
        peak = max(peak, running)
    return peak


def test_a_tenants_flood_is_held_while_another_tenants_run_goes_through(
        processes: Processes, postgres_backend: Backend) -> None:
    processes.worker("w", PAL_TENANT_CONCURRENCY="2")
    processes.beat()
    client = limited_client(postgres_backend, "2")
    flood = [client.start_run(napping_graph(0.6), {"n": n}, tenant_id="acme") for n in range(6)]
    held = [r.id for r in client.runtime.journal.runs.list_runs(tenant_id="acme") if r.held]
    assert sorted(held) == sorted(flood[2:])
    other = client.start_run(napping_graph(0.0), {"n": "globex"}, tenant_id="globex")
    assert not client.get_run(other).held
    spans = [span(client, run_id) for run_id in flood]
    assert most_at_once(spans) <= 2
    assert span(client, other)[1] < spans[-1][0]  # done before the flood's last run even started
    for run_id in flood:
        assert_exactly_once(client, run_id)
    client.close()


def test_a_concurrency_key_holds_across_workers_and_a_sigkill(processes: Processes, postgres_backend: Backend,
                                                              tmp_path: Path) -> None:
    client = Client(postgres_backend.settings)
    graph = napping_graph(1.5, concurrency={"key": "{{ input.customer }}", "limit": 1})
    doomed = processes.worker("doomed")
    first = client.start_run(graph, {"customer": "x", "n": 1})
    assert wait_until(lambda: any(e.kind == "step_started" and e.step_id == "nap"
                                  for e in client.events(first)), timeout=60)
    rest = [client.start_run(graph, {"customer": "x", "n": n}) for n in (2, 3)]
    other = client.start_run(graph, {"customer": "y", "n": 1})
    assert [client.get_run(r).held for r in rest] == [True, True] and not client.get_run(other).held
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=30)
    processes.two_solo_workers_and_beat()
    spans = [span(client, run_id) for run_id in (first, *rest)]
    assert most_at_once(spans) == 1  # the key's runs, one at a time, the killed one's re-drive included
    assert span(client, other)[1] < spans[-1][0]
    assert any(e.kind == "run_recovered" for e in client.events(first))
    for run_id in (first, *rest, other):
        assert_exactly_once(client, run_id)
    client.close()


def test_held_runs_start_by_priority_and_bad_keys_are_refused(processes: Processes,
                                                              postgres_backend: Backend) -> None:
    client = limited_client(postgres_backend, "1")
    busy = client.start_run(napping_graph(0.0), {"n": "busy"})
    order = [client.start_run(napping_graph(0.0, priority=4), {"n": "graph-4"}),
             client.start_run(napping_graph(0.0, priority=4), {"n": "asked-1"}, priority=1),
             client.start_run(napping_graph(0.0), {"n": "default-3"})]
    with pytest.raises(ResumeRefused, match="admission slot"):  # a held run waits its turn
        resume(client.runtime, order[0])
    assert client.runtime.journal.runs.get_lease(order[0]) is None
    processes.worker("w", PAL_TENANT_CONCURRENCY="1")
    processes.beat()
    starts = {run_id: span(client, run_id)[0] for run_id in (busy, *order)}
    assert sorted(order, key=starts.__getitem__) == [order[1], order[2], order[0]]
    before = len(client.list_runs(limit=100))
    keyed = napping_graph(0.0, concurrency={"key": "{{ input.customer }}", "limit": 1})
    for bad_input in ({}, {"customer": {"nested": 1}}, {"customer": "x" * 300}, {"customer": True}):
        with pytest.raises(InputError, match="concurrency key"):
            client.start_run(keyed, bad_input)
    with pytest.raises(InputError, match="may not use secrets"):
        client.start_run(napping_graph(0.0, concurrency={"key": "{{ secrets.API_KEY }}", "limit": 1}), {})
    for priority in (0, 6, "1", 2.5):
        with pytest.raises(InputError, match="priority"):
            client.start_run(napping_graph(0.0), {}, priority=priority)  # type: ignore[arg-type]
    assert len(client.list_runs(limit=100)) == before
    client.close()
