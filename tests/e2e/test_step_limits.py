"""Every step has a time limit, enforced from outside the step's own code, and a cancellation stops a
running step: the step is journaled as failed (or fenced out) and its worker is free again. Real
`pal worker` processes (solo and prefork pools run a step in the process's main thread) and the
in-process threads pool. docs/security.md, "Time limits"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.errors import GraphError
from pal.plan.programs import parse_plan
from tests.conftest import Backend
from tests.support.graphs import linear, single
from tests.support.processes import Processes
from tests.support.workers import in_process_worker


def slow(tool: str, seconds: float, timeout_ms: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {"tool": tool, "args": {"seconds": seconds}}
    if timeout_ms is not None:
        data["timeoutMs"] = timeout_ms
    return single({"id": "slow", "type": "tool", "data": data})


def failure_of(client: Client, run_id: str) -> dict[str, Any]:
    [failed] = [e for e in client.runtime.journal.runs.events(run_id) if e.kind == "step_failed"]
    error: dict[str, Any] = failed.payload["error"]
    return error


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_step_past_its_limit_is_stopped_and_its_worker_freed(
        processes: Processes, postgres_backend: Backend, counter: Path, pool: str) -> None:
    client = Client(postgres_backend.settings)
    try:
        processes.worker("w", concurrency=1 if pool == "prefork" else 0)
        # A sleep (a blocking wait) and a busy Python loop, each far longer than its 300 ms limit.
        sleeper = client.start_run(slow("nap", 30, 300), {})
        spinner = client.start_run(slow("spin", 120, 300), {})
        after = client.start_run(linear(counter, 1), {})  # queued behind them on the one process
        for run_id in (sleeper, spinner, after):
            assert client.wait(run_id, timeout=25).status in ("failed", "succeeded")
        for run_id in (sleeper, spinner):
            run = client.get_run(run_id)
            assert run.status == "failed"
            error = failure_of(client, run_id)
            assert error["code"] == "step_timeout" and error["class"] == "timeout"
            assert "time limit of 0.3s" in error["message"]
        assert client.get_run(after).status == "succeeded"
        assert client.runtime.journal.doctor.violations() == []
    finally:
        client.close()


def test_a_step_past_its_limit_in_a_threads_pool_is_stopped(postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings.with_(lease_ttl=1.5))
    try:
        with in_process_worker(client, concurrency=1):
            run_id = client.start_run(slow("spin", 120, 200), {})
            assert client.wait(run_id, timeout=25).status == "failed"
        assert failure_of(client, run_id)["code"] == "step_timeout"
    finally:
        client.close()


def test_a_timed_out_step_is_retried_by_its_policy(processes: Processes, postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings)
    try:
        processes.worker("w")
        graph = slow("nap", 30, 200)
        graph["nodes"][1]["data"]["retry"] = {"maxAttempts": 2, "retryableClasses": ["timeout"]}
        run_id = client.start_run(graph, {})
        assert client.wait(run_id, timeout=25).status == "failed"
        kinds = [e.kind for e in client.runtime.journal.runs.events(run_id) if e.step_id == "slow"]
        assert kinds == ["step_started", "step_retrying", "step_started", "step_failed"]
    finally:
        client.close()


def test_cancelling_a_run_stops_its_running_step(processes: Processes, postgres_backend: Backend,
                                                  counter: Path) -> None:
    client = Client(postgres_backend.settings)
    try:
        processes.worker("w")  # one solo process: while the nap runs, nothing else can
        run_id = client.start_run(slow("nap", 30, 600_000), {})
        assert wait_until(lambda: any(e.kind == "step_started" and e.step_id == "slow"
                                      for e in client.runtime.journal.runs.events(run_id)), 20)
        client.cancel(run_id, reason="stop it")
        after = client.start_run(linear(counter, 1), {})
        # Done long before the 30 s nap could have ended: the cancelled step was stopped.
        assert client.wait(after, timeout=20).status == "succeeded"
        assert client.get_run(run_id).status == "cancelled"
        assert not [e for e in client.runtime.journal.runs.events(run_id) if e.kind == "step_completed"
                    and e.step_id == "slow"]
        assert "lease generation" in (processes.folder / "w.log").read_text()
    finally:
        client.close()


@pytest.mark.parametrize("timeout", [0, -1, 86_400_001, True, 1.5, "100", None])
def test_a_bad_time_limit_is_refused_at_validation(timeout: Any) -> None:
    graph = slow("nap", 1, None)
    graph["nodes"][1]["data"]["timeoutMs"] = timeout
    with pytest.raises(GraphError, match="timeoutMs"):
        parse_plan(graph, known_tools=None)
