"""Tenants on one VM host share nothing (docs/isolated-tier.md): over the real `pal api` (each
tenant with its own token), `pal worker --vm-host` and `pal beat`, an attacker's VM beside a victim's
VM, both naming the same `workdir`, finds neither the victim's folder nor its harness, cannot journal
into its run, and the victim's VM runs in the cgroup its document asked for. A workload's error text
carrying credentials is journaled redacted, and nowhere else in clear."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.vms.paths import tenant_segment
from tests.conftest import Backend
from tests.support import sinks
from tests.support.api_server import RECEIPT_ENV, Api
from tests.support.processes import Processes
from tests.support.vms import logs, microvm, vm_host_of

VICTIM_VALUE = "victim-only-value-5d81"

VICTIM = f"""
import os, time
from pal import sdk
with open("victim.txt", "w") as f:
    f.write({VICTIM_VALUE!r})
sdk.run_step("s1", lambda: {{"secret": {VICTIM_VALUE!r}}})
for _ in range(1200):  # until the test releases it (at most 2 minutes)
    if os.path.exists("release"):
        break
    time.sleep(0.1)
sdk.set_output({{"victim": "done"}})
"""

ATTACKER = r"""
import errno, json, os, socket, stat
from pal import sdk

def outcome(fn):
    try:
        return fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

report = {"victim_file_here": os.path.exists("victim.txt"),
          "victim_dir": outcome(lambda: os.listdir(os.environ["VICTIM_DIR"])),
          "victim_state": outcome(lambda: os.listdir(os.environ["STATE_DIR"]))}
sockets = []
for top, dirs, files in os.walk("/"):
    if top in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    sockets += [os.path.join(top, f) for f in files if stat.S_ISSOCK(os.lstat(os.path.join(top, f)).st_mode)]
answers = {}
for path in sockets:
    for request in ({"op": "completed"},
                    {"op": "step", "step_id": "forged", "event": "completed", "output": {"x": 1}, "key": "guess"},
                    {"op": "output", "output": {"owned": True}, "key": ""}):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(path)
                s.sendall(json.dumps(request).encode() + b"\n")
                answers.setdefault(path, []).append(s.makefile("rb").readline().decode()[:300])
        except OSError as exc:
            answers.setdefault(path, []).append(errno.errorcode.get(exc.errno, "?"))
report["answers"] = answers
sdk.set_output(report)
"""


@pytest.fixture
def vm_host(api: Api, processes: Processes, tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    with vm_host_of(api, processes, tmp_path) as host:
        yield host


def _start(api: Api, token: str, document: dict[str, object]) -> str:
    reply = api.call("POST", "/v1/runs", token, json={"graph": document, "input": {}})
    assert reply.status_code == 201, reply.text
    run_id: str = reply.json()["id"]
    return run_id


def test_an_attacker_vm_beside_a_victim_vm_reaches_nothing_of_it(vm_host: tuple[Api, Path]) -> None:
    api, root = vm_host
    client = api.client
    # A workdir naming PAL_VM_ROOT itself or smuggling qemu syntax is refused; nothing is written.
    for workdir in (".", "a,b", "x,path=..", "a b", "../globex/shared"):
        refused = api.call("POST", "/v1/runs", api.token, json={"graph": microvm(workdir, "true"), "input": {}})
        assert refused.status_code == 422 and "'/'-separated names" in refused.text, refused.text
    assert client.list_runs() == []

    acme = root / tenant_segment("acme") / "shared"
    acme.mkdir(parents=True)
    (acme / "victim.py").write_text(VICTIM)
    victim = _start(api, api.token, microvm("shared", sys.executable, "victim.py")
                    | {"memoryMb": 256, "pids": 64, "cpus": 0.5})
    assert wait_until(lambda: any(e.kind == "step_completed" for e in client.events(victim)), timeout=90), \
        logs(root)
    [victim_vm] = client.runtime.journal.vms.vms(victim)
    # The victim's VM runs in the cgroup its document asked for.
    cgroup = Path("/sys/fs/cgroup")
    assert (cgroup / "memory" / "pal" / victim_vm.id / "memory.limit_in_bytes").read_text().strip() \
        == str(256 << 20)
    assert (cgroup / "pids" / "pal" / victim_vm.id / "pids.max").read_text().strip() == "64"
    assert (cgroup / "cpu" / "pal" / victim_vm.id / "cpu.cfs_quota_us").read_text().strip() == "50000"

    globex = root / tenant_segment("globex") / "shared"
    globex.mkdir(parents=True)
    (globex / "attacker.py").write_text(ATTACKER)
    attacker = _start(api, api.other, microvm("shared", sys.executable, "attacker.py", VICTIM_DIR=str(acme),
                                              STATE_DIR=str(root / ".state" / victim_vm.id)))
    attacked = client.wait(attacker, timeout=120)
    assert attacked.status == "succeeded", (attacked.error, logs(root))
    report = attacked.output
    assert report["victim_file_here"] is False  # the same workdir name is another folder
    assert report["victim_dir"] == "ENOENT" and report["victim_state"] == "ENOENT"
    assert sorted(report["answers"]) == ["/run/pal/sdk.sock"]  # its own harness, nobody else's
    assert all("refused: this harness answers its own VM's workload only" in a
               for a in report["answers"]["/run/pal/sdk.sock"]), report["answers"]
    assert not (globex / "victim.txt").exists()

    (acme / "release").touch()
    done = client.wait(victim, timeout=120)
    assert done.status == "succeeded" and done.output == {"victim": "done"}, (done.error, logs(root))
    assert [e.step_id for e in client.events(victim) if e.step_id] == ["s1", "s1"]  # started, completed
    assert (acme / "victim.txt").read_text() == VICTIM_VALUE
    # Over REST, the other tenant sees none of it.
    assert api.call("GET", f"/v1/runs/{victim}", api.other).status_code == 404
    assert VICTIM_VALUE not in json.dumps(attacked.output)


SECRET = "vm-secret-value-0a9e7c33"
BEARER = "Bearer abcdefghijklmnopqrstuvwx0123"


@pytest.mark.parametrize("api_env", [RECEIPT_ENV | {"PAL_SECRET_VM_KEY": SECRET}])
def test_a_vm_error_carrying_credentials_is_stored_redacted(
        vm_host: tuple[Api, Path], processes: Processes, postgres_backend: Backend) -> None:
    api, root = vm_host
    client = api.client
    failing = (f"from pal import sdk\n"
               f"def fail():\n    raise RuntimeError('login ' + {SECRET!r} + ' with {BEARER} ' + 'x' * 5000)\n"
               f"sdk.run_step('call', fail)\n")
    work = root / tenant_segment("acme") / "errs"  # the credential is the workload's, not the document's
    work.mkdir(parents=True)
    (work / "fail.py").write_text(failing)
    run_id = _start(api, api.token, microvm("errs", sys.executable, "fail.py"))
    run = client.wait(run_id, timeout=120)
    assert run.status == "failed", logs(root)
    failed = [e for e in client.events(run_id) if e.kind == "step_failed"]
    assert failed and all("[secret:VM_KEY]" in json.dumps(e.payload) for e in failed), failed
    # Every table, every answer about the run, the control plane's and workers' logs. (The harness's log
    # holds the workload's own output, on the VM host, root's alone: what a workload prints is its own.)
    found = (sinks.database_rows(postgres_backend.settings.database_url)
             | sinks.run_answers(api.url, api.token, client, run_id) | sinks.logs(processes.folder))
    assert sinks.leaks(SECRET, found) == [] and sinks.leaks(BEARER.split()[1], found) == []
