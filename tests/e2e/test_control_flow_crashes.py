"""Durable control flow with real processes: an approval and a budget pause outlive every worker,
Redis and Postgres;
a loop killed in iteration 7 of 10 resumes there; a parent killed after spawning its child never
spawns a second; nested approvals are approved from the command line."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import redis

from pal.cli.demo import stop_process, wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.graphs import approval, linear, loop, parent_of, single
from tests.support.processes import Processes
from tests.support.tools import calls

# A Redis database of its own, so that flushing it cannot touch any other test's keys.
FLUSHED_DB_URL = "redis://127.0.0.1:6379/10"


@pytest.mark.disruptive  # restarts Postgres: run alone (tests/run_suite.py)
def test_an_approval_and_a_budget_pause_survive_workers_redis_and_postgres_restarting(
        postgres_backend: Backend, tmp_path: Path) -> None:
    backend = Backend("postgres", postgres_backend.settings.with_(broker_url=FLUSHED_DB_URL))
    procs = Processes(backend, tmp_path)
    counter, spent = tmp_path / "calls.log", tmp_path / "spent.log"
    try:
        first = procs.worker("w1")
        beat = procs.beat()
        client = Client(backend.settings)
        run_id = client.start_run(approval(counter), {"amount": 12, "customer": "acme"})
        # start and s0 run; s1 is past maxSteps 2 and waits before its node runs
        paused_id = client.start_run(linear(spent, 2) | {"limits": {"maxSteps": 2, "onBreach": "pause"}}, {})
        assert wait_until(lambda: client.get_run(run_id).status == "waiting"
                          and client.get_run(paused_id).status == "waiting", timeout=60)
        for process in (first, beat):  # every PAL process goes, without a chance to clean up
            process.kill()
            process.wait(timeout=30)
        redis.Redis.from_url(FLUSHED_DB_URL).flushdb()
        subprocess.run("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart",
                       shell=True, check=True, timeout=120)
        client.runtime.journal.engine.dispose()  # this process's pooled connections died too
        assert client.get_run(run_id).status == "waiting" and client.get_run(paused_id).status == "waiting"
        procs.worker("w2")
        procs.beat()
        listed = procs.cli("runs", "approvals", run_id)
        assert listed.returncode == 0 and f"run {run_id} step gate waits for a decision" in listed.stdout
        assert "prompt: Refund 12 to acme?" in listed.stdout
        approved = procs.cli("runs", "approve", run_id, "gate", "--comment", "after the storm", "--by", "ada")
        assert approved.returncode == 0, approved.stderr
        assert "approved; dispatched: pay" in approved.stdout
        run = client.wait(run_id, timeout=120)
        assert run.status == "succeeded" and run.output == "paid"
        assert_exactly_once(client, run_id)
        assert calls(counter) == ["pay"]
        again = procs.cli("runs", "approve", run_id, "gate")
        assert again.returncode == 6 and "nothing waits there" in again.stderr
        listed = procs.cli("runs", "approvals", paused_id)
        assert listed.returncode == 0 and f"run {paused_id} step s1 waits for a decision  [budget]" in listed.stdout
        assert len(spent.read_text().splitlines()) == 1  # s0 only
        resumed = procs.cli("runs", "approve", paused_id, "s1", "--by", "ada")
        assert resumed.returncode == 0 and "approved; dispatched: s1" in resumed.stdout, resumed.stderr
        assert wait_until(lambda: [p.step_id for p in client.pending_approvals(paused_id)] == ["out"], timeout=60)
        assert procs.cli("runs", "approve", paused_id, "out").returncode == 0
        assert client.wait(paused_id, timeout=60).status == "succeeded"
        assert_exactly_once(client, paused_id)
        assert len(spent.read_text().splitlines()) == 2  # s1 ran exactly once, after the approval
        client.close()
    finally:
        procs.stop_all()


def test_sigkill_in_loop_iteration_7_of_10_resumes_there(processes: Processes, postgres_backend: Backend,
                                                         tmp_path: Path) -> None:
    counter = tmp_path / "calls.log"
    doomed = processes.worker("doomed", PAL_FAULT_POINT="before_effect:each[6].work",
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    client = Client(postgres_backend.settings)
    run_id = client.start_run(loop(counter), {"items": list(range(10, 20))})
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    assert calls(counter) == [f"item-{i}" for i in range(6)]  # iterations 1 to 6 done, 7 interrupted
    processes.worker("fresh")
    processes.beat()
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded", run.error
    assert run.output == [{"index": i, "got": 10 + i} for i in range(10)]
    assert calls(counter) == [f"item-{i}" for i in range(10)]  # each tool ran exactly once
    recovered = [e.payload for e in client.events(run_id) if e.kind == "run_recovered"]
    assert recovered and recovered[0]["resumed_steps"] == ["each[6].work"]
    assert_exactly_once(client, run_id)
    client.close()


def test_a_parent_killed_after_spawning_its_child_never_spawns_a_second(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    counter = tmp_path / "calls.log"
    child = single({"id": "c", "type": "tool", "data": {"tool": "count", "args": {
        "path": str(counter), "label": "child", "value": "{{ input.n }}"}}})
    # after_effect of `sub`: the child run exists (and is queued), the parent has not parked yet.
    doomed = processes.worker("doomed", PAL_FAULT_POINT="after_effect:sub",
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    client = Client(postgres_backend.settings)
    run_id = client.start_run(parent_of(child, child_input={"n": 7}), {})
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    assert len(client.runtime.journal.runs.children(run_id)) == 1
    processes.worker("fresh")
    processes.beat()
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded", run.error
    assert run.output == {"label": "child", "value": 7}
    assert len(client.runtime.journal.runs.children(run_id)) == 1
    assert calls(counter) == ["child"]
    assert_exactly_once(client, run_id)
    client.close()


def test_a_nested_approval_two_levels_deep_is_approved_from_the_command_line(
        processes: Processes, postgres_backend: Backend, tmp_path: Path) -> None:
    counter = tmp_path / "calls.log"
    worker = processes.worker("w")
    client = Client(postgres_backend.settings)
    graph = parent_of(parent_of(approval(counter), child_input={"amount": 4, "customer": "initech"}))
    run_id = client.start_run(graph, {})
    assert wait_until(lambda: bool(client.pending_approvals(run_id)), timeout=60)
    [pending] = client.pending_approvals(run_id)
    listed = processes.cli("runs", "approvals", run_id, "--json")
    assert listed.returncode == 0 and pending.run_id in listed.stdout and '"depth": 2' in listed.stdout
    approved = processes.cli("runs", "approve", pending.run_id, "gate", "--hash", pending.approval_hash)
    assert approved.returncode == 0, approved.stderr
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded" and run.output == "paid"
    assert calls(counter) == ["pay"]
    stop_process(worker)
    client.close()
