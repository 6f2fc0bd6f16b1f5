"""A deploy stops a worker (SIGTERM) while it runs a long step: the step gets PAL_SHUTDOWN_GRACE to
finish, then its lease is handed back and another worker runs it again with the same attempt (so the
same idempotency key). No beat runs here and the lease is a minute long, so nothing but the hand-back
can re-drive the step."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.nodes.base import idempotency_key
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.processes import Processes
from tests.support.tools import calls

LONG_LEASE = "60s"


def long_step_graph(tool: str, seconds: float, path: Path) -> dict[str, object]:
    return {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "long", "type": "tool",
                       "data": {"tool": tool, "args": {"seconds": seconds, "path": str(path), "label": "began"}}},
                      {"id": "after", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 0}}}],
            "edges": [{"source": "t", "target": "long"}, {"source": "long", "target": "after"}]}


def stopping_worker(procs: Processes, pool: str, grace: str) -> subprocess.Popen[bytes]:
    args = ["--pool", "prefork", "--concurrency", "1"] if pool == "prefork" else ["--pool", "solo"]
    return procs.start(["worker", *args, "--hostname", "stopping@%h", "--loglevel", "INFO"], "stopping.log",
                       PAL_SHUTDOWN_GRACE=grace, PAL_LEASE_TTL=LONG_LEASE)


@pytest.mark.parametrize("pool, tool", [("solo", "nap"), ("prefork", "nap"), ("solo", "anap")])
def test_a_step_past_the_grace_is_handed_back_and_rerun_with_its_key(
        postgres_backend: Backend, tmp_path: Path, pool: str, tool: str) -> None:
    procs = Processes(postgres_backend, tmp_path)
    client = Client(postgres_backend.settings)
    began = tmp_path / "began.log"
    try:
        stopping = stopping_worker(procs, pool, "2s")
        run_id = client.start_run(long_step_graph(tool, 30, began))
        assert wait_until(lambda: len(calls(began)) == 1, timeout=60)
        procs.start(["worker", "--pool", "solo", "--hostname", "next@%h", "--loglevel", "INFO"], "next.log",
                    PAL_LEASE_TTL=LONG_LEASE)
        stopping.send_signal(signal.SIGTERM)
        stopping.wait(timeout=60)
        log = (tmp_path / "stopping.log").read_text()
        assert f"run {run_id} handed back: step(s) long rung again (generation 2)" in log
        assert wait_until(lambda: len(calls(began)) == 2, timeout=60)  # the next worker runs it again
        events = client.events(run_id)
        started = [e for e in events if e.kind == "step_started" and e.step_id == "long"]
        assert [e.generation for e in started] == [1, 2]
        assert {e.attempt for e in started} == {1}  # one attempt, so one idempotency key
        assert idempotency_key(run_id, "long", started[0].attempt) == idempotency_key(
            run_id, "long", started[1].attempt)
        assert Counter(e.kind for e in events)["run_recovered"] == 1
    finally:
        client.close()
        procs.stop_all()


def test_a_step_that_finishes_within_the_grace_is_not_handed_back(
        postgres_backend: Backend, tmp_path: Path) -> None:
    procs = Processes(postgres_backend, tmp_path)
    client = Client(postgres_backend.settings)
    began = tmp_path / "began.log"
    try:
        stopping = stopping_worker(procs, "solo", "60s")
        run_id = client.start_run(long_step_graph("nap", 2, began))
        assert wait_until(lambda: len(calls(began)) == 1, timeout=60)
        stopping.send_signal(signal.SIGTERM)
        stopping.wait(timeout=60)  # it finished the step (and took no new one), then stopped
        events = client.events(run_id)
        assert [e.step_id for e in events if e.kind == "step_completed"] == ["t", "long"]  # not "after"
        assert "grace over" not in (tmp_path / "stopping.log").read_text()
        procs.worker("next", PAL_LEASE_TTL=LONG_LEASE)
        assert client.wait(run_id, timeout=60).status == "succeeded"
        assert_exactly_once(client, run_id)
        assert len(calls(began)) == 1
    finally:
        client.close()
        procs.stop_all()
