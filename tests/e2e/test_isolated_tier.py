"""The isolated tier for real, with the `namespace` driver: a `pal api` control plane, a
`pal worker --vm-host` that spawns VMs, beat's sweep. A workload of four SDK steps whose VM is
SIGKILLed during step 3 is resumed in a second VM with PAL_RESUME=1 that reads steps 1 and 2 back;
a workload that always crashes ends `microvm_resume_exhausted` after 3 VMs; isolation is asserted
from inside the sandbox, in each VM (docs/isolated-tier.md)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.vms.paths import tenant_segment
from tests.support.api_server import Api
from tests.support.processes import Processes
from tests.support.vms import VM_GUEST, logs, microvm, vm_host_of

AGENT = """
import json, os, socket, sys, time
from pal import sdk

seen = {"pid": os.getpid(), "interfaces": sorted(name for _, name in socket.if_nameindex())}
try:
    socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
    seen["postgres"] = "reachable"
except OSError as exc:
    seen["postgres"] = type(exc).__name__
try:
    with open(os.environ["OUTSIDE"], "w") as f:
        f.write("escaped")
    seen["outside"] = "written"
except OSError as exc:
    seen["outside"] = exc.strerror
with open(f"seen-{os.environ['PAL_RESUME']}.json", "w") as f:
    json.dump(seen, f)

def note(line):
    with open("ledger.txt", "a") as ledger:
        ledger.write(line + "\\n")

for i in (1, 2, 3, 4):
    def body(i=i):
        note(f"s{i} resume={os.environ['PAL_RESUME']}")
        if i == 3 and not os.path.exists("in-step-3"):  # the first VM to get here
            open("in-step-3", "w").close()
            time.sleep(120)  # the test kills the VM here
        return {"i": i, "square": i * i}
    got = sdk.run_step(f"s{i}", body)
    assert got == {"i": i, "square": i * i}, got
sdk.set_output({"steps": 4})
"""



@pytest.fixture
def vm_host(api: Api, processes: Processes, tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    """A VM host worker reporting to the api fixture's control plane, and beat."""
    with vm_host_of(api, processes, tmp_path) as host:
        yield host


@pytest.mark.parametrize("driver", ["namespace", pytest.param("qemu-microvm", marks=pytest.mark.qemu)])
def test_a_vm_killed_in_step_3_resumes_in_a_second_vm_that_skips_steps_1_and_2(
        vm_host: tuple[Api, Path], processes: Processes, tmp_path: Path, driver: str) -> None:
    api, root = vm_host
    if driver == "qemu-microvm":  # `make test` builds it; a bare `pytest` is told how, never skipped
        assert (VM_GUEST / "initrd.img").exists(), f"no qemu-microvm guest in {VM_GUEST}: run `make vm-guest`"
    client = api.client
    work = root / tenant_segment(client.runtime.settings.tenant) / "agent"
    work.mkdir(parents=True)
    (work / "agent.py").write_text(AGENT)
    outside = tmp_path / "outside.txt"
    run_id = client.start_run(microvm("agent", sys.executable, "agent.py", driver=driver, OUTSIDE=str(outside)),
                              {})
    assert wait_until(lambda: (work / "in-step-3").exists(), timeout=90), logs(root)
    in_step_3 = client.runtime.journal.vms.vms(run_id)[-1]
    assert in_step_3.state == "running" and in_step_3.pid
    os.killpg(in_step_3.pid, signal.SIGKILL)  # the whole VM: harness, sandbox, workload
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded", (run.error, logs(root))
    assert run.output == {"steps": 4}
    ledger = (work / "ledger.txt").read_text().splitlines()
    assert ledger == ["s1 resume=0", "s2 resume=0", "s3 resume=0", "s3 resume=1", "s4 resume=1"] or (
        driver == "qemu-microvm"  # a first microVM that never booted was stopped by its harness's watchdog
        and ledger == ["s1 resume=1", "s2 resume=1", "s3 resume=1", "s3 resume=1", "s4 resume=1"])
    vms = client.runtime.journal.vms.vms(run_id)
    assert [(v.attempt, v.state) for v in vms][-2:] == [(len(vms) - 1, "terminated"), (len(vms), "terminated")]
    assert len(vms) == 2 or (driver == "qemu-microvm" and len(vms) == 3 and vms[0].state == "failed")
    events = client.events(run_id)
    completed = [e.step_id for e in events if e.kind == "step_completed"]
    assert completed == ["s1", "s2", "s3", "s4"]  # each once, across both VMs
    assert any(e.kind == "run_recovered" for e in events)
    assert client.runtime.journal.doctor.violations() == []
    shown = processes.cli("runs", "events", run_id, "--json")  # the workload's steps, like any other
    assert shown.returncode == 0, shown.stderr
    assert [e["step_id"] for e in json.loads(shown.stdout) if e["kind"] == "step_completed"] == completed
    listed = processes.cli("runs", "vms", run_id)
    assert listed.returncode == 0 and "attempt 2" in listed.stdout and "terminated" in listed.stdout
    # Isolation, asserted from inside, in each VM.
    seen_files = sorted(work.glob("seen-*.json"))
    assert seen_files, logs(root)
    for seen_file in seen_files:
        seen = json.loads(seen_file.read_text())
        assert seen["interfaces"] == ["lo"]  # only loopback
        assert seen["postgres"] != "reachable"  # the host's services are out of reach
        if driver == "namespace":
            assert seen["pid"] == 1  # PID 1 of its own tree
        assert seen["outside"] != "written"
    assert not outside.exists()  # the sandbox's /tmp is its own memory, never the host's


def test_a_workload_that_always_crashes_is_exhausted_after_three_vms(vm_host: tuple[Api, Path]) -> None:
    api, _ = vm_host
    client = api.client
    run_id = client.start_run(microvm("crasher", sys.executable, "-c", "raise SystemExit(3)"), {})
    run = client.wait(run_id, timeout=120)
    assert run.status == "failed" and run.error["code"] == "microvm_resume_exhausted"
    assert run.error["attempts"] == 3
    assert [(v.attempt, v.exit_code) for v in client.runtime.journal.vms.vms(run_id)] == [(1, 3), (2, 3), (3, 3)]
    assert [e.kind for e in client.events(run_id)].count("run_failed") == 1
