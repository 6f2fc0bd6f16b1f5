"""The isolated tier's journal on both backends (pal.storage.vms, pal.engine.vms): a microVM run
gets one first VM however often it is started; resumeMicroVMRun respawns at 0-2 attempts, fails
the run `microvm_resume_exhausted` at 3 and skips a run with a live VM; racing sweepers add one VM;
a report of a superseded VM, a forged token or a malformed body is refused with nothing written."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from pal.client import Client
from pal.core.clock import utcnow
from pal.engine.vms import report, token_hash
from pal.errors import GraphError, InputError, Refused

DOCUMENT = {"kind": "microvm", "command": ["python3", "agent.py"], "workdir": "w1"}


@pytest.fixture
def vm_client(client: Client) -> tuple[Client, list[str]]:
    spawned: list[str] = []
    client.runtime.publish_vm = spawned.append
    return client, spawned


def take(client: Client, vm_id: str, token: str) -> None:
    assert client.runtime.journal.vms.take_vm(vm_id=vm_id, host="h", token_hash=token_hash(token), now=utcnow())


def test_a_microvm_run_gets_one_first_vm(vm_client: tuple[Client, list[str]]) -> None:
    client, spawned = vm_client
    run_id = client.start_run(DOCUMENT, {}, run_id="vm-run-1")
    client.start_run(DOCUMENT, {}, run_id="vm-run-1")  # a repeated start
    [vm] = client.runtime.journal.vms.vms(run_id)
    assert spawned == [vm.id] and (vm.attempt, vm.state) == (1, "pending")
    assert client.get_run(run_id).kind == "microvm"


@pytest.mark.parametrize("workdir", ["../../etc", ".", "a,b", "x,path=..", "a b", "a//b", ".state"])
def test_a_hostile_document_is_refused_and_nothing_is_written(vm_client: tuple[Client, list[str]],
                                                              workdir: str) -> None:
    client, spawned = vm_client
    with pytest.raises(GraphError, match="'/'-separated names"):
        client.start_run(DOCUMENT | {"workdir": workdir}, {}, run_id="vm-bad")
    assert spawned == [] and client.list_runs() == []


def test_resume_respawns_until_the_third_vm_then_exhausts(vm_client: tuple[Client, list[str]]) -> None:
    client, _ = vm_client
    journal = client.runtime.journal
    run_id = client.start_run(DOCUMENT, {})
    stale = 2 * client.settings.lease_ttl
    for attempt in (2, 3):
        action, order = journal.vms.resume_microvm_run(run_id=run_id, now=utcnow() + timedelta(minutes=10 * attempt),
                                                       stale_after=stale, boot_lease=stale)
        assert (str(action), order.attempt if order else None) == ("respawn", attempt)
        assert order is not None and order.resume
    action, order = journal.vms.resume_microvm_run(run_id=run_id, now=utcnow() + timedelta(hours=1),
                                                   stale_after=stale, boot_lease=stale)
    assert (str(action), order) == ("exhausted", None)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "microvm_resume_exhausted"
    assert run.error["attempts"] == 3
    states = [v.state for v in journal.vms.vms(run_id)]
    assert states == ["terminated", "terminated", "terminated"]  # each reconciled: no heartbeat
    assert [e.kind for e in client.events(run_id)].count("run_failed") == 1
    assert journal.doctor.violations() == []


def test_a_run_with_a_live_vm_is_skipped(vm_client: tuple[Client, list[str]]) -> None:
    client, _ = vm_client
    journal = client.runtime.journal
    run_id = client.start_run(DOCUMENT, {})
    [vm] = journal.vms.vms(run_id)
    take(client, vm.id, "tok-live")
    report(client.runtime, "tok-live", {"type": "heartbeat"})  # alive just now
    # The lease has lapsed, but the VM's heartbeat is recent: the VM manages itself.
    action, order = journal.vms.resume_microvm_run(run_id=run_id, now=utcnow() + timedelta(seconds=61),
                                                   stale_after=3600, boot_lease=60)
    assert (str(action), order) == ("skip", None) and len(journal.vms.vms(run_id)) == 1


def test_racing_sweepers_add_one_vm(vm_client: tuple[Client, list[str]]) -> None:
    client, _ = vm_client
    journal = client.runtime.journal
    run_id = client.start_run(DOCUMENT, {})
    results: list[str] = []
    barrier = threading.Barrier(4)

    def sweep() -> None:
        barrier.wait()
        action, _ = journal.vms.resume_microvm_run(run_id=run_id, now=utcnow() + timedelta(hours=1),
                                                   stale_after=60, boot_lease=600)
        results.append(str(action))

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["respawn", "skip", "skip", "skip"]
    assert [v.attempt for v in journal.vms.vms(run_id)] == [1, 2]


def test_reports_step_through_the_fenced_journal(vm_client: tuple[Client, list[str]]) -> None:
    client, _ = vm_client
    run_id = client.start_run(DOCUMENT, {})
    [vm] = client.runtime.journal.vms.vms(run_id)
    take(client, vm.id, "tok-1")
    rt = client.runtime
    report(rt, "tok-1", {"type": "step", "step_id": "fetch", "event": "started"})
    report(rt, "tok-1", {"type": "step", "step_id": "fetch", "event": "completed", "output": {"n": 1}})
    report(rt, "tok-1", {"type": "step", "step_id": "fetch", "event": "completed", "output": {"n": 2}})
    assert report(rt, "tok-1", {"type": "resume"})["steps"] == {"fetch": {"n": 1}}  # a duplicate is a no-op
    report(rt, "tok-1", {"type": "exit", "code": 0, "output": "done"})
    run = client.get_run(run_id)
    assert run.status == "succeeded" and run.output == "done"
    with pytest.raises(Refused):
        report(rt, "tok-1", {"type": "heartbeat"})  # a finished VM reports nothing more
    assert client.runtime.journal.doctor.violations() == []


def test_a_superseded_vms_report_is_refused_and_writes_nothing(vm_client: tuple[Client, list[str]]) -> None:
    client, _ = vm_client
    journal, rt = client.runtime.journal, client.runtime
    run_id = client.start_run(DOCUMENT, {})
    [first] = journal.vms.vms(run_id)
    take(client, first.id, "tok-old")
    report(rt, "tok-old", {"type": "heartbeat"})
    # Its heartbeats stop; the sweep reconciles it and starts attempt 2 under a new generation.
    _, order = journal.vms.resume_microvm_run(run_id=run_id, now=utcnow() + timedelta(hours=1),
                                              stale_after=60, boot_lease=600)
    assert order is not None
    take(client, order.vm_id, "tok-new")
    before = len(client.events(run_id))
    for body in ({"type": "step", "step_id": "late", "event": "completed", "output": 1},
                 {"type": "heartbeat"}, {"type": "exit", "code": 0}):
        with pytest.raises(Refused):
            report(rt, "tok-old", body)
    assert len(client.events(run_id)) == before and client.get_run(run_id).status != "succeeded"
    report(rt, "tok-new", {"type": "heartbeat"})  # the current VM still reports


@pytest.mark.parametrize("token", [None, "", "forged", "x" * 5000])
def test_a_forged_token_is_refused(vm_client: tuple[Client, list[str]], token: str | None) -> None:
    client, _ = vm_client
    client.start_run(DOCUMENT, {})
    with pytest.raises(Refused, match="unknown, finished or superseded VM"):
        report(client.runtime, token, {"type": "heartbeat"})


@pytest.mark.parametrize(("body", "fragment"), [
    ({"type": "reboot"}, "'type' is heartbeat, step, resume or exit"),
    ([1, 2], "'type' is heartbeat"),
    ({"type": "step", "step_id": "../x", "event": "completed"}, "'step_id' must be"),
    ({"type": "step", "step_id": "a", "event": "exploded"}, "'event' must be one of"),
    ({"type": "step", "step_id": "a", "event": "completed", "output": "x" * 2_000_000}, "PAL_MAX_OUTPUT_BYTES"),
    ({"type": "exit", "code": "zero"}, "integer 'code'"),
])
def test_a_malformed_report_is_refused_and_writes_nothing(vm_client: tuple[Client, list[str]], body: Any,
                                                          fragment: str) -> None:
    client, _ = vm_client
    run_id = client.start_run(DOCUMENT, {})
    [vm] = client.runtime.journal.vms.vms(run_id)
    take(client, vm.id, "tok-m")
    before = len(client.events(run_id))
    with pytest.raises(InputError, match=fragment):
        report(client.runtime, "tok-m", body)
    assert len(client.events(run_id)) == before
