"""`python -m pal.harness`: a VM's supervisor (docs/isolated-tier.md).

Started by a VM driver with the VM's id, report token and control-plane URL in its environment, it
- starts the workload (`PAL_VM_COMMAND`) in the driver's sandbox, in the VM's work directory, with
  `PAL_RESUME` (1 on a resume) and `PAL_HARNESS_SOCKET`, and never with the token;
- serves the workload's SDK (`pal.sdk`) on that Unix socket: the saved outputs of completed steps,
  and step events, which it reports to `POST /v1/runtime/report`;
- sends heartbeats, which renew the run's lease;
- reports the workload's exit.
Reports are retried while the control plane is briefly unreachable (the workload keeps running);
the journal de-duplicates them (a step completes once). A refusal means this VM no longer holds the
run (an earlier attempt's VM, a finished run): the harness then stops the workload and exits.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

_RETRY_FOR_S = 60.0  # how long a report is retried while the control plane is unreachable
BOOT_WAIT_S = 20.0  # a microVM that printed nothing by then is stopped
EXIT_WAIT_S = 5.0  # a microVM whose workload ended is stopped if it has not powered off by then
_PR_SET_PDEATHSIG = 1

# The namespace sandbox's first process: every mount read-only, then the work directory bound
# writable over it, a fresh sysfs for the new network namespace, and the workload exec'd as PID 1.
_SANDBOX = r"""
set -e
W="$1"; shift
mount --make-rprivate /
for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
mount --bind "$W" "$W"
mount -o remount,bind,rw "$W"
mount -t sysfs sysfs /sys 2>/dev/null || true
cd "$W"
exec "$@"
"""


def say(line: str) -> None:
    """One line of the harness's log (its stderr, the work directory's .pal/harness-N.log)."""
    print(f"{time.strftime('%H:%M:%S')} harness: {line}", file=sys.stderr, flush=True)


class Refused(Exception):
    """The control plane refused a report: this VM does not hold the run any more."""


class ControlPlane:
    def __init__(self, url: str, token: str) -> None:
        self._url = url.rstrip("/") + "/v1/runtime/report"
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http = httpx.Client(timeout=10.0)

    def report(self, body: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + _RETRY_FOR_S
        delay = 0.2
        while True:
            try:
                reply = self._http.post(self._url, json=body, headers=self._headers)
            except httpx.TransportError:
                reply = None
            if reply is not None and reply.status_code < 500:
                if reply.status_code in (401, 403, 409):
                    raise Refused(reply.text)
                if reply.status_code >= 400:
                    raise ValueError(reply.text)
                answer: dict[str, Any] = reply.json()
                return answer
            if time.monotonic() > deadline:
                raise ConnectionError(f"the control plane at {self._url} did not answer for "
                                      f"{_RETRY_FOR_S:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _die_with_parent() -> None:
    """In the sandbox's `unshare`, before it execs: it gets SIGKILL when the harness dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def sandboxed(command: list[str], workdir: Path) -> list[str]:
    """The namespace sandbox around `command` (PAL_VM_SANDBOX=namespace), else `command` itself."""
    if os.environ.get("PAL_VM_SANDBOX") != "namespace":
        return command
    return ["unshare", "--pid", "--fork", "--net", "--mount", "--ipc", "--uts", "--mount-proc",
            "--kill-child=SIGKILL", "sh", "-c", _SANDBOX, "pal-sandbox", str(workdir), *command]


def microvm(workdir: Path, socket_path: Path, attempt: str) -> list[str]:
    """A KVM microVM booted from the guest of pal.vms.guest_image: the host's root read-only and the
    work directory writable over 9p, the SDK's channel a virtio-serial port (`pal`) connected to
    the harness's socket, no network device at all, 512 MiB, one vCPU, gone when it powers off; on KVM
    unless PAL_VM_ACCEL says tcg."""
    guest = Path(os.environ["PAL_VM_GUEST"])
    console = workdir / ".pal" / f"console-{attempt}.log"
    accel = os.environ.get("PAL_VM_ACCEL", "kvm")  # tcg: emulated, where KVM cannot run a guest
    cpu = "host" if accel == "kvm" else "max"
    return ["qemu-system-x86_64", "-M", f"microvm,accel={accel}", "-cpu", cpu, "-m", "512", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(guest / "vmlinuz"), "-initrd", str(guest / "initrd.img"),
            "-append", f"console=ttyS0 panic=-1 quiet pal.workdir={workdir} pal.python={sys.executable}"
                       + (f" pal.keep={kept}" if (kept := kept_under_tmp()) else "")
                       + (f" tsc_early_khz={khz}" if accel == "tcg" and (khz := host_tsc_khz()) else ""),
            "-serial", f"file:{console}",
            "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device", "virtio-9p-device,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev", f"local,id=work,path={workdir},security_model=none",
            "-device", "virtio-9p-device,fsdev=work,mount_tag=work",
            "-device", "virtio-serial-device",
            "-chardev", f"socket,id=pal,path={socket_path}",
            "-device", "virtserialport,chardev=pal,name=pal"]


def host_tsc_khz(cpuinfo: str = "/proc/cpuinfo") -> int | None:
    """The host's TSC rate in kHz, which an emulated guest's TSC runs at (qemu's TCG reads the host's
    counter), where the host says it (`constant_tsc`, then its first `cpu MHz`); else None.

    Why: a microVM has no PIT, HPET or ACPI PM timer, so an emulated guest kernel cannot measure its
    TSC. On some hosts (AMD EPYC under a hypervisor, docs/isolated-tier.md) its CPUID does not say
    the rate either, the boot marks the TSC unstable and waits for a timer tick that never comes, and
    the microVM prints nothing. Told the rate (`tsc_early_khz`), it boots in seconds."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    mhz = next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("cpu MHz")), "")
    try:
        khz = round(float(mhz) * 1000)
    except ValueError:
        return None
    return khz if "constant_tsc" in flags.split() and khz > 0 else None


def kept_under_tmp() -> str:
    """The host folders a guest must still see under its private /tmp (its /init mounts a fresh
    tmpfs there): the Python environment and the folder `pal` is imported from, when they live
    under the host's /tmp (a checkout or a virtualenv there), colon-separated; "" for none."""
    spec = importlib.util.find_spec("pal")
    found = {sys.prefix, os.path.realpath(sys.prefix)}
    for package in (spec.submodule_search_locations or []) if spec else []:
        found.add(os.path.dirname(os.path.realpath(package)))
    return ":".join(sorted(p for p in found if p.startswith("/tmp/")))


class Harness:
    def __init__(self) -> None:
        env = os.environ
        self.vm_id = env["PAL_VM_ID"]
        self.workdir = Path(env["PAL_VM_WORKDIR"])
        self.command: list[str] = json.loads(env["PAL_VM_COMMAND"])
        self.user_env: dict[str, str] = json.loads(env.get("PAL_VM_ENV", "{}"))
        self.resume = env.get("PAL_RESUME") == "1"
        self.interval = max(float(env.get("PAL_LEASE_TTL", "30")) / 3, 0.2)
        self.control = ControlPlane(env["PAL_CONTROL_URL"], env["PAL_VM_TOKEN"])
        self.socket_path = self.workdir / ".pal" / "harness.sock"
        self.output: Any = None
        self.workload: subprocess.Popen[bytes] | None = None
        self.stopped = threading.Event()

    def run(self) -> int:
        self.control.report({"type": "heartbeat"})
        server = self._serve()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.user_env,
               "PAL_RESUME": "1" if self.resume else "0", "PAL_HARNESS_SOCKET": str(self.socket_path),
               "HOME": str(self.workdir)}
        # Started before any thread of the harness: preexec_fn is safe only in a single-threaded parent.
        self.workload = subprocess.Popen(self._launch(), env=env, cwd=self.workdir,
                                         preexec_fn=_die_with_parent)
        say(f"VM {self.vm_id}: workload started (pid {self.workload.pid}, resume {int(self.resume)})")
        threading.Thread(target=self._accept, args=(server,), name="sdk", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        if self.in_microvm:
            threading.Thread(target=self._watch_microvm, name="watchdog", daemon=True).start()
        code = self.workload.wait()
        say(f"VM {self.vm_id}: workload ended ({code})")
        self.stopped.set()
        server.close()
        if self.in_microvm:  # the guest's /init wrote the workload's own exit code
            exit_file = self.workdir / ".pal" / "exit-code"
            code = int(exit_file.read_text().strip() or 1) if exit_file.exists() else 137
        elif code < 0:
            code = 128 - code  # killed by a signal: the shell's convention
        try:
            self.control.report({"type": "exit", "code": code, "output": self.output})
            say(f"VM {self.vm_id}: exit {code} reported")
        except (Refused, ConnectionError) as exc:
            say(f"the exit was not reported: {exc}")
        return code

    @property
    def in_microvm(self) -> bool:
        return os.environ.get("PAL_VM_SANDBOX") == "qemu-microvm"

    def _launch(self) -> list[str]:
        if not self.in_microvm:
            return sandboxed(self.command, self.workdir)
        # What the guest's launcher runs, handed over through the work directory.
        (self.workdir / ".pal" / "exit-code").unlink(missing_ok=True)
        (self.workdir / ".pal" / "launch.json").write_text(json.dumps(
            {"command": self.command, "env": self.user_env, "resume": self.resume}))
        return microvm(self.workdir, self.socket_path, os.environ.get("PAL_VM_ATTEMPT", "1"))

    def _watch_microvm(self) -> None:
        """qemu (7.2, emulated) now and then neither boots nor exits: a VM whose console stays empty
        for BOOT_WAIT_S is stopped (it ends as a failed VM, and the sweep starts the next one); one
        whose guest recorded its exit code is given EXIT_WAIT_S to leave, then stopped."""
        state = self.workdir / ".pal"
        console = state / f"console-{os.environ.get('PAL_VM_ATTEMPT', '1')}.log"
        started = time.monotonic()
        while not self.stopped.wait(0.5):
            if not (console.exists() and console.stat().st_size) and time.monotonic() - started > BOOT_WAIT_S:
                self._stop_workload(f"the microVM printed nothing in {BOOT_WAIT_S:g}s")
                return
            if (state / "exit-code").exists():
                if not self.stopped.wait(EXIT_WAIT_S):
                    self._stop_workload(f"the microVM did not power off {EXIT_WAIT_S:g}s after its workload")
                return

    def _stop_workload(self, why: str) -> None:
        say(f"stopping the workload: {why}")
        if self.workload is not None and self.workload.poll() is None:
            self.workload.kill()

    def _beat(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.control.report({"type": "heartbeat"})
            except Refused as exc:
                self._stop_workload(f"the control plane refused a heartbeat: {exc}")
                return
            except (ConnectionError, ValueError) as exc:
                say(f"heartbeat: {exc}")

    def _serve(self) -> socket.socket:
        self.socket_path.parent.mkdir(mode=0o700, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.socket_path))
        server.listen(8)
        return server

    def _accept(self, server: socket.socket) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                try:
                    answer = self._answer(json.loads(line))
                except Refused as exc:
                    answer = {"ok": False, "error": f"refused: {exc}"}
                    self._stop_workload("the control plane refused a step report")
                except (ValueError, ConnectionError, KeyError, TypeError) as exc:
                    answer = {"ok": False, "error": str(exc)}
                stream.write(json.dumps(answer).encode() + b"\n")
                stream.flush()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "completed":
            return self.control.report({"type": "resume"})
        if op == "step":
            return self.control.report({"type": "step", "step_id": request["step_id"],
                                        "event": request["event"], "output": request.get("output"),
                                        "error": request.get("error")})
        if op == "output":
            self.output = request.get("output")
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    return Harness().run()


if __name__ == "__main__":
    sys.exit(main())
