"""The isolated tier against a hostile workload, over a real `pal api`, `pal worker --vm-host` and
`pal beat` (docs/isolated-tier.md, "What a sandbox holds against"). A workload run as an attacker
would write it tries to remount, write outside, make namespaces, trace, read the host's processes
and other runs' folders, talk to every Unix socket it finds, and plants links and FIFOs under every
name the host ever touched; each attempt is refused and the host's files are untouched. Then the
limits: a memory hog and a fork bomb are stopped by their VM's cgroup, the VM fails, the sweep goes
on as for any failed VM, and the host serves the next run."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.harness import MAX_WORKLOAD_LOG
from pal.vms.paths import tenant_segment
from pal.vms.sandbox import python_paths
from tests.support.api_server import Api
from tests.support.processes import Processes
from tests.support.vms import VM_GUEST, logs, microvm, vm_host_of

HOST_MARKER = "host-only-marker-9f2c41"  # in the VM host worker's environment, never a workload's

# Every name the host's harness, qemu or firecracker ever opened in a work directory, past and present.
HOST_NAMES = [".pal/harness-1.log", ".pal/harness-2.log", ".pal/launch.json", ".pal/console-2.log",
              ".pal/harness.sock", ".pal/work.img", ".pal/firecracker-2.log", ".pal/vsock.sock", "harness.log",
              "console.log", "sdk.sock", "ctl.sock", "launch.json"]

PROBE = r"""
import ctypes, errno, json, os, socket, stat, subprocess, sys
from pal import sdk

libc = ctypes.CDLL(None, use_errno=True)
name = lambda e: errno.errorcode.get(e, str(e))

def outcome(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return name(exc.errno)

def syscall(rc):
    if rc != 0:
        raise OSError(ctypes.get_errno(), "refused")

if os.environ["PAL_RESUME"] == "1":  # the second VM: the first one's findings are the output
    with open("report.json") as f:
        sdk.set_output(json.load(f))
    sys.exit(0)

report = {}
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
report["uid"] = os.getuid()
report["status"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")}
report["remount_root"] = outcome(lambda: syscall(libc.mount(b"none", b"/", None, 0x20 | 0x1000, None)))
report["mount_tmpfs"] = outcome(lambda: syscall(libc.mount(b"t", b"/tmp", b"tmpfs", 0, None)))
report["mount_command"] = subprocess.run(["mount", "-o", "remount,bind,rw", "/"], capture_output=True).returncode
report["unshare_user"] = outcome(lambda: syscall(libc.unshare(0x10000000)))
report["unshare_mount"] = outcome(lambda: syscall(libc.unshare(0x00020000)))
report["unshare_command"] = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True).returncode
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
report["setns"] = outcome(lambda: syscall(libc.setns(fd, 0)))
child = subprocess.Popen(["sleep", "30"])
report["ptrace_attach"] = outcome(lambda: syscall(libc.ptrace(16, child.pid, None, None)))
child.kill()
report["chroot"] = outcome(lambda: os.chroot("/tmp"))
report["writes"] = {}
for target in (os.environ["SENTINEL"], "/usr/pal-escape", "/etc/pal-escape", "/pal-escape",
               os.environ["OTHER_DIR"] + "/pal-escape"):
    def write(target=target):
        with open(target, "w") as f:
            f.write("escaped")
    report["writes"][target] = outcome(write)
report["read_other_dir"] = outcome(lambda: os.listdir(os.environ["OTHER_DIR"]))
report["read_vm_root"] = outcome(lambda: os.listdir(os.environ["VM_ROOT"]))
environs = []
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environs.append(f.read().decode(errors="replace"))
    except OSError:
        pass
report["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
report["host_marker_seen"] = any("HOST_ONLY_MARKER=" in e for e in environs)
report["token_seen"] = any("PAL_VM_TOKEN" in e for e in environs)
sockets, seen = [], 0
skip = {"/proc", "/sys", "/dev", *filter(None, os.environ.get("SKIP_WALK", "").split(":"))}
for top, dirs, files in os.walk("/"):
    if top in skip:
        dirs[:] = []
        continue
    for entry in files:
        seen += 1
        if seen > 400000:
            break
        path = os.path.join(top, entry)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                sockets.append(path)
        except OSError:
            pass
report["sockets"] = {}
for path in sockets:
    answers = []
    for key in (None, "guessed-key"):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(path)
                request = {"op": "completed"} | ({"key": key} if key else {})
                s.sendall(json.dumps(request).encode() + b"\n")
                answers.append(s.makefile("rb").readline().decode()[:300])
        except OSError as exc:
            answers.append(name(exc.errno))
    report["sockets"][path] = answers
planted = {}
os.makedirs(".pal", exist_ok=True)
for i, n in enumerate(json.loads(os.environ["HOST_NAMES"])):
    planted[n] = outcome(lambda: os.mkfifo(n)) if i % 2 else outcome(lambda: os.symlink(os.environ["TARGET"], n))
with open(".pal/exit-code", "wb") as f:
    f.truncate(10 << 30)  # a sparse 10 GiB "exit code"
report["planted"] = planted
report["step"] = sdk.run_step("probe", lambda: {"probed": True})
with open("report.json", "w") as f:
    json.dump(report, f)
sys.exit(1)  # so that a second VM starts among the planted links and FIFOs
"""


@pytest.fixture
def vm_host(api: Api, processes: Processes, tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    with vm_host_of(api, processes, tmp_path, HOST_ONLY_MARKER=HOST_MARKER) as host:
        yield host


@pytest.mark.parametrize("driver", ["namespace", pytest.param("qemu-microvm", marks=pytest.mark.qemu)])
def test_a_hostile_workload_is_refused_everything_and_the_host_is_untouched(
        vm_host: tuple[Api, Path], tmp_path: Path, driver: str) -> None:
    api, root = vm_host
    if driver == "qemu-microvm":
        assert (VM_GUEST / "initrd.img").exists(), f"no qemu-microvm guest in {VM_GUEST}: run `make vm-guest`"
    tenant = tenant_segment(api.client.runtime.settings.tenant)
    work = root / tenant / "probe"
    work.mkdir(parents=True)
    (work / "probe.py").write_text(PROBE)
    other = root / tenant / "other-run"  # another run's folder, with a file of its own
    other.mkdir()
    (other / "notes.txt").write_text("other run's notes")
    sentinel = tmp_path / "host-sentinel.txt"
    sentinel.write_text("host file")
    target = tmp_path / "planted-target.txt"  # where every planted link points: must never appear
    etc_owner = os.stat("/etc").st_uid
    # Over emulated 9p, walking the read-only system and Python trees for sockets takes minutes: a
    # microVM's walk leaves them out (the namespace sandbox walks everything).
    skip = ":".join(["/usr", *python_paths()]) if driver == "qemu-microvm" else ""
    run_id = api.client.start_run(microvm(
        "probe", sys.executable, "probe.py", driver=driver, SENTINEL=str(sentinel), OTHER_DIR=str(other),
        VM_ROOT=str(root), TARGET=str(target), HOST_NAMES=json.dumps(HOST_NAMES), SKIP_WALK=skip), {})
    run = api.client.wait(run_id, timeout=240)
    assert run.status == "succeeded", (run.error, logs(root))
    report = run.output
    vms = api.client.runtime.journal.vms.vms(run_id)
    assert [v.exit_code for v in vms][-2:] == [1, 0], logs(root)  # the second VM started among the plants

    # Unprivileged: not root, no capability at all, no way to gain one, the filter on.
    assert report["uid"] == api.client.runtime.settings.vm_uid
    assert report["status"] == {"CapEff": "0" * 16, "CapPrm": "0" * 16, "CapBnd": "0" * 16, "NoNewPrivs": "1",
                                "Seccomp": "2"}
    for attempt in ("remount_root", "mount_tmpfs", "unshare_user", "unshare_mount", "setns", "ptrace_attach",
                    "chroot"):
        assert report[attempt] == "EPERM", (attempt, report[attempt])
    assert report["mount_command"] != 0 and report["unshare_command"] != 0
    # Nothing written outside the work directory, nothing of the host or another run seen.
    assert all(outcome != "allowed" for outcome in report["writes"].values()), report["writes"]
    assert sentinel.read_text() == "host file" and not (other / "pal-escape").exists()
    assert (other / "notes.txt").read_text() == "other run's notes"
    assert report["read_other_dir"] == "ENOENT" and report["read_vm_root"] == "ENOENT"
    assert report["host_marker_seen"] is False and report["token_seen"] is False
    # The only socket is the VM's own (none in a microVM: its channel is a port), and without the
    # VM's key it answers nothing.
    own = ["/run/pal/sdk.sock"] if driver == "namespace" else []
    assert sorted(report["sockets"]) == own, report["sockets"]
    for answers in report["sockets"].values():
        assert all("refused: this harness answers its own VM's workload only" in a for a in answers), answers
    # The planted links and FIFOs led the host nowhere: the second VM ran, the target never appeared.
    assert sorted(report["planted"]) == sorted(HOST_NAMES)
    # qemu's 9p server refuses special files from a guest; links it lets through, and so does the namespace.
    planted = {n for n, outcome in report["planted"].items() if outcome == "allowed"}
    assert planted == set(HOST_NAMES) if driver == "namespace" else planted >= set(HOST_NAMES[::2])
    assert not target.exists() and not os.path.lexists(target)
    assert os.stat("/etc").st_uid == etc_owner
    assert [e.step_id for e in api.client.events(run_id) if e.kind == "step_completed"] == ["probe"]
    for vm in vms:  # each VM's harness log is in its own state folder, a plain file of the host's
        log = root / ".state" / vm.id / "harness.log"
        assert log.is_file() and not log.is_symlink() and "workload ended" in log.read_text()


def test_a_workdir_through_a_planted_link_is_refused_and_the_host_is_untouched(
        vm_host: tuple[Api, Path], tmp_path: Path) -> None:
    """A workload links `<its workdir>/sub` to a host folder; a run whose workdir is `<that>/sub` must
    not make the host chown or share that folder."""
    api, root = vm_host
    client = api.client
    tenant_dir = root / tenant_segment(client.runtime.settings.tenant)
    victim = tmp_path / "host-folder"
    victim.mkdir()
    first = client.start_run(microvm("attacker", sys.executable, "-c",
                                     f"import os; os.symlink({str(victim)!r}, 'sub')"), {})
    assert client.wait(first, timeout=120).status == "succeeded", logs(root)
    assert (tenant_dir / "attacker" / "sub").is_symlink()
    second = client.start_run(microvm("attacker/sub", sys.executable, "-c", "open('owned', 'w').write('x')"), {})
    run = client.wait(second, timeout=120)
    assert run.status == "failed" and run.error["code"] == "microvm_resume_exhausted", logs(root)
    assert "is not a plain folder" in logs(root)
    assert os.stat(victim).st_uid == 0 and list(victim.iterdir()) == []


def test_a_workload_printing_without_end_fills_no_disk_of_the_hosts(vm_host: tuple[Api, Path]) -> None:
    api, root = vm_host
    client = api.client
    flood = "import sys\nfor _ in range(64):\n    sys.stdout.write('y' * (1 << 20))\nsys.stdout.flush()\n"
    run_id = client.start_run(microvm("flood", sys.executable, "-c", flood), {})
    assert client.wait(run_id, timeout=120).status == "succeeded", logs(root)
    [vm] = client.runtime.journal.vms.vms(run_id)
    log = root / ".state" / vm.id / "harness.log"
    assert MAX_WORKLOAD_LOG <= log.stat().st_size < MAX_WORKLOAD_LOG + 4096  # 64 MiB printed, 16 kept
    assert "output past 16 MiB is not kept" in log.read_text(errors="replace")[-4096:]


@pytest.mark.parametrize(("limits", "program", "exit_code"), [
    ({"memoryMb": 128}, "chunks = [b'x' * (1 << 20) for _ in range(4096)]", 137),
    ({"pids": 32}, (
        "import os, sys, time\n"
        "kids = 0\n"
        "try:\n"
        "    for _ in range(10000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        kids += 1\n"
        "except BlockingIOError:\n"
        "    open('forks.txt', 'w').write(str(kids)); sys.exit(3)\n"), 3),
], ids=["memory-hog", "fork-bomb"])
def test_a_workload_over_its_limits_is_stopped_and_the_host_serves_the_next_run(
        vm_host: tuple[Api, Path], limits: dict[str, int], program: str, exit_code: int) -> None:
    api, root = vm_host
    client = api.client
    run_id = client.start_run(microvm("hog", sys.executable, "-c", program) | limits, {})
    run = client.wait(run_id, timeout=180)
    assert run.status == "failed" and run.error["code"] == "microvm_resume_exhausted", logs(root)
    assert [v.exit_code for v in client.runtime.journal.vms.vms(run_id)] == [exit_code] * 3, logs(root)
    if "pids" in limits:
        forks = int((root / tenant_segment(client.runtime.settings.tenant) / "hog" / "forks.txt").read_text())
        assert forks < limits["pids"]
    else:
        assert "killed for its memory limit (128 MiB)" in logs(root)
    after = client.start_run(microvm("next", sys.executable, "-c", "print('fine')"), {})
    assert client.wait(after, timeout=120).status == "succeeded", logs(root)
    groups = [Path("/sys/fs/cgroup", *parts, vm.id) for vm in client.runtime.journal.vms.vms(run_id)
              for parts in (("memory", "pal"), ("pids", "pal"), ("cpu", "pal"), ("pal",))]
    assert wait_until(lambda: not any(g.exists() for g in groups), timeout=30)  # each VM's cgroup removed
