"""Crash-resume under real SIGKILL: `pal worker` processes die at each named fault point, and a
fresh worker plus the beat-driven sweep finish the run with nothing completed twice."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.faults import STEP_POINTS
from tests.conftest import Backend
from tests.support.graphs import linear
from tests.support.processes import Processes
from tests.support.tools import calls


def steps_completed(client: Client, run_ids: list[str]) -> int:
    return sum(e.kind == "step_completed" for r in run_ids for e in client.events(r))


def assert_exactly_once(client: Client, run_id: str) -> None:
    events = client.events(run_id)
    completed = Counter(e.step_id for e in events if e.kind == "step_completed")
    assert set(completed.values()) == {1}, completed
    terminal = [e.kind for e in events if e.kind in ("run_succeeded", "run_failed", "run_cancelled")]
    assert terminal == ["run_succeeded"]
    assert client.runtime.journal.runs.get_lease(run_id) is None
    assert client.runtime.journal.doctor.violations() == []  # `pal doctor` finds the journal clean


@pytest.mark.parametrize("point", STEP_POINTS)
def test_worker_killed_at_fault_point_and_the_sweep_finishes_the_run(
    processes: Processes, postgres_backend: Backend, tmp_path: Path, point: str
) -> None:
    killed_at_then_finished(processes, postgres_backend, tmp_path, point)


def killed_at_then_finished(processes: Processes, postgres_backend: Backend, tmp_path: Path, point: str) -> None:
    """A worker dies at `point` in the second of three steps; a fresh worker and beat finish the
    run, each step completed once, only the interrupted tool's effect made twice, and only when
    the kill came after it."""
    counter = tmp_path / "calls.log"
    step = "" if point == "during_finish" else ":s1"
    doomed = processes.worker("doomed", PAL_FAULT_POINT=point + step,
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    client = Client(postgres_backend.settings)
    run_id = client.start_run(linear(counter, 3), {})
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    assert (tmp_path / "fired").exists()
    assert not client.get_run(run_id).terminal or point == "during_finish"
    processes.worker("fresh")
    processes.beat()
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded"
    assert_exactly_once(client, run_id)
    made = calls(counter)
    # Tools that completed before the crash ran once; the interrupted one may run again only when
    # the kill came after its effect and before step_completed (the contract of a re-invocable step).
    assert made.count("s0") == 1 and made.count("s2") == 1
    assert made.count("s1") == (2 if point == "after_effect" else 1)
    recovered = [e for e in client.events(run_id) if e.kind == "run_recovered"]
    assert len(recovered) >= 1
    client.close()


def test_stopped_worker_wakes_up_fenced_out(processes: Processes, postgres_backend: Backend,
                                            tmp_path: Path) -> None:
    """SIGSTOP a worker mid-step, let the sweep hand the run to another worker, SIGCONT: the
    sleeper's late completion is refused by the journal."""
    client = Client(postgres_backend.settings)
    naps = tmp_path / "naps"
    graph = {"nodes": [{"id": "t", "type": "trigger"},
                       {"id": "slow", "type": "tool",
                        "data": {"tool": "nap", "args": {"seconds": 3, "path": str(naps), "label": "slow"}}},
                       {"id": "out", "type": "output", "data": {"value": "{{ nodes.slow.output }}"}}],
             "edges": [{"source": "t", "target": "slow"}, {"source": "slow", "target": "out"}]}
    sleeper = processes.worker("sleeper")
    run_id = client.start_run(graph, {})
    # Inside the node, not only started: a step the completion before it claimed ahead (a solo
    # worker's chain) is started in the journal a moment before its node runs.
    assert wait_until(lambda: calls(naps) == ["slow"], timeout=60)
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        processes.beat()
        processes.worker("rescuer")
        assert client.wait(run_id, timeout=120).status == "succeeded"
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    time.sleep(4)  # let the sleeper finish its nap and try to complete: bounded, once
    events = client.events(run_id)
    slow_done = [e for e in events if e.kind == "step_completed" and e.step_id == "slow"]
    assert len(slow_done) == 1 and slow_done[0].generation >= 2
    assert_exactly_once(client, run_id)
    assert "fenced out" in (tmp_path / "sleeper.log").read_text()
    client.close()


def test_pal_runs_stuck_and_resume(processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    client = Client(postgres_backend.settings.with_(lease_ttl=2.0))
    pal = processes.cli

    # No worker yet: the run's lease is live but idle (no step runs under it; its message may as
    # well be lost), so resume takes it over at once instead of waiting for it to lapse.
    idle = client.start_run(linear(tmp_path / "a.log", 2), {})
    resumed = pal("runs", "resume", idle)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {idle} re-driven at generation 2; resumed steps: start" in resumed.stdout
    # A lease that lapsed makes the run stuck: listed with how long, and resumable.
    lapsed = client.start_run(linear(tmp_path / "b.log", 2), {})
    assert wait_until(lambda: lapsed in pal("runs", "stuck").stdout, timeout=30)
    assert "lease expired" in pal("runs", "stuck").stdout
    assert pal("runs", "resume", lapsed).returncode == 0
    processes.worker("w")
    for run_id in (idle, lapsed):
        assert client.wait(run_id, timeout=120).status == "succeeded"
        assert_exactly_once(client, run_id)
    assert calls(tmp_path / "a.log") == ["s0", "s1"] and calls(tmp_path / "b.log") == ["s0", "s1"]
    # A step running under a live lease is never taken over: that could run it twice.
    graph = {"nodes": [{"id": "t", "type": "trigger"},
                       {"id": "slow", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 4}}}],
             "edges": [{"source": "t", "target": "slow"}]}
    busy = client.start_run(graph, {})
    assert wait_until(lambda: any(e.kind == "step_started" and e.step_id == "slow"
                                  for e in client.events(busy)), timeout=60)
    refused = pal("runs", "resume", busy)
    assert refused.returncode == 6
    assert "slow running under" in refused.stderr and "its lease is live" in refused.stderr
    assert client.wait(busy, timeout=120).status == "succeeded"
    again = pal("runs", "resume", busy)
    assert again.returncode == 6 and "nothing to resume" in again.stderr
    assert "no stuck runs" in pal("runs", "stuck").stdout
    client.close()
