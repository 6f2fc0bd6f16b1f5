"""`python -m pal.harness`: a VM's supervisor (docs/isolated-tier.md).

Started by a VM driver as root on the VM host, with the VM's id, report token, work directory and
limits in its environment, it
- makes the VM's cgroup (memory, CPU, processes) and opens the work directory without following a
  link (it is the only writable host folder the workload gets);
- starts the workload in the driver's sandbox, as the unprivileged PAL_VM_UID, with `PAL_RESUME`,
  `PAL_HARNESS_SOCKET` and `PAL_HARNESS_KEY` (a secret of this VM's), never with the token;
- serves the workload's SDK (`pal.sdk`) on a socket in the VM's private state folder, answering only
  requests that carry the key: the saved outputs of completed steps, and step events, which it
  reports to `POST /v1/runtime/report`;
- sends heartbeats, which renew the run's lease, and reports the workload's exit.
Reports are retried while the control plane is briefly unreachable (the workload keeps running);
the journal de-duplicates them (a step completes once). A refusal means this VM no longer holds the
run (an earlier attempt's VM, a finished run): the harness then stops the workload and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from pal.vms import DriverError
from pal.vms.cgroups import Group, Limits
from pal.vms.paths import open_work_dir
from pal.vms.qemu import QEMU_OVERHEAD_MB, microvm
from pal.vms.sandbox import SANDBOX_SOCKET, SYSTEM_PATH, WORK, namespace_command

_RETRY_FOR_S = 60.0  # how long a report is retried while the control plane is unreachable
BOOT_WAIT_S = 20.0  # a microVM that printed nothing by then is stopped
EXIT_WAIT_S = 5.0  # a microVM whose workload ended is stopped if it has not powered off by then
MAX_LINE = 8 << 20  # one SDK request; the control plane caps outputs itself (PAL_MAX_OUTPUT_BYTES)
MAX_WORKLOAD_LOG = 16 << 20  # what the harness's log keeps of a workload's (or a microVM's console) output
OOM_EXIT = 137  # the code of a workload the kernel killed for its memory limit, as a shell reports it
_PR_SET_PDEATHSIG = 1


def say(line: str) -> None:
    """One line of the harness's log (its stderr: the VM's state folder's harness.log)."""
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
    """In the sandbox's first process, before it execs: it gets SIGKILL when the harness dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _listen(path: Path, owner: int) -> socket.socket:
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chown(path, owner, owner)
    os.chmod(path, 0o600)
    server.listen(8)
    return server


class Harness:
    def __init__(self) -> None:
        env = os.environ
        self.vm_id = env["PAL_VM_ID"]
        self.root = Path(env["PAL_VM_ROOT"])
        self.work = env["PAL_VM_WORK"].split("/")
        self.state = Path(env["PAL_VM_STATE"])
        self.command: list[str] = json.loads(env["PAL_VM_COMMAND"])
        self.user_env: dict[str, str] = json.loads(env.get("PAL_VM_ENV", "{}"))
        self.resume = env.get("PAL_RESUME") == "1"
        self.uid = int(env["PAL_VM_UID"])
        self.limits = Limits(int(env["PAL_VM_MEMORY_MB"]) << 20, float(env["PAL_VM_CPUS"]),
                             int(env["PAL_VM_PIDS"]))
        self.expose = tuple(p for p in env.get("PAL_VM_EXPOSE", "").split(":") if p)
        self.interval = max(float(env.get("PAL_LEASE_TTL", "30")) / 3, 0.2)
        self.control = ControlPlane(env["PAL_CONTROL_URL"], env["PAL_VM_TOKEN"])
        self.key = secrets.token_urlsafe(32)  # the workload's, to talk to this harness alone
        self.output: Any = None
        self.exit_code: int | None = None  # a microVM's, told by its guest's launcher
        self.printed = 0  # bytes of output (a microVM's console: it booted when there are some)
        self.workload: subprocess.Popen[bytes] | None = None
        self.stopped = threading.Event()

    @property
    def in_microvm(self) -> bool:
        return os.environ.get("PAL_VM_SANDBOX") == "qemu-microvm"

    def run(self) -> int:
        self.control.report({"type": "heartbeat"})
        work_fd = open_work_dir(self.root, self.work, self.uid, self.uid)
        # Sockets by name in the state folder, the harness's and qemu's working folder: a Unix socket's
        # path may not pass 107 bytes, and PAL_VM_ROOT may be deep.
        os.chdir(self.state)
        servers = [_listen(Path("sdk.sock"), self.uid)]
        if self.in_microvm:
            servers.append(_listen(Path("ctl.sock"), 0))
        limits = self.limits
        if self.in_microvm:  # qemu's own threads and memory beside its guest's
            limits = Limits(limits.memory_bytes + (QEMU_OVERHEAD_MB << 20), limits.cpus, max(limits.pids, 64))
        group = Group(self.vm_id, limits)
        launch, env = self._launch(work_fd)

        def prepare() -> None:
            _die_with_parent()
            group.join()

        # Started before any thread of the harness: preexec_fn is safe only in a single-threaded parent.
        self.workload = subprocess.Popen(launch, env=env, cwd=self.state, pass_fds=(work_fd,),
                                         preexec_fn=prepare, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        os.close(work_fd)
        printer = threading.Thread(target=self._keep_output, name="output", daemon=True)
        printer.start()
        say(f"VM {self.vm_id}: workload started (pid {self.workload.pid}, resume {int(self.resume)})")
        threading.Thread(target=self._accept, args=(servers[0], self._sdk_session), name="sdk",
                         daemon=True).start()
        if self.in_microvm:
            threading.Thread(target=self._accept, args=(servers[1], self._ctl_session), name="ctl",
                             daemon=True).start()
            threading.Thread(target=self._watch_microvm, name="watchdog", daemon=True).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        code = self.workload.wait()
        printer.join(timeout=5)
        say(f"VM {self.vm_id}: workload ended ({code})")
        self.stopped.set()
        for server in servers:
            server.close()
        if group.oom_killed():
            say(f"VM {self.vm_id}: killed for its memory limit ({limits.memory_bytes >> 20} MiB)")
            code = OOM_EXIT
        elif self.in_microvm:
            code = self.exit_code if self.exit_code is not None else OOM_EXIT
        elif code < 0:
            code = 128 - code  # killed by a signal: the shell's convention
        group.remove()
        try:
            self.control.report({"type": "exit", "code": code, "output": self.output})
            say(f"VM {self.vm_id}: exit {code} reported")
        except (Refused, ConnectionError) as exc:
            say(f"the exit was not reported: {exc}")
        return code

    def _launch(self, work_fd: int) -> tuple[list[str], dict[str, str]]:
        """The sandbox's command and its environment: the launcher's own, never the workload's (which
        reaches the workload alone, past the point where it could steer a root shell)."""
        env = {"PATH": SYSTEM_PATH}  # the sandbox's own tools, never the workload's PATH
        if not self.in_microvm:
            env["PAL_SANDBOX_ENV"] = json.dumps(self._workload_env(SANDBOX_SOCKET))
            return namespace_command(self.command, root=self._view(), work_fd=work_fd,
                                     sdk_socket=self.state / "sdk.sock", uid=self.uid, extra=self.expose), env
        return microvm(guest=Path(os.environ["PAL_VM_GUEST"]), view=self._view(), work_fd=work_fd,
                       sdk_socket=Path("sdk.sock"), ctl_socket=Path("ctl.sock"),
                       accel=os.environ.get("PAL_VM_ACCEL", "kvm"),
                       memory_mb=self.limits.memory_bytes >> 20, cpus=max(1, math.ceil(self.limits.cpus)),
                       uid=self.uid, extra=self.expose), env

    def _view(self) -> Path:
        view = self.state / "root"
        view.mkdir(mode=0o700, exist_ok=True)
        return view

    def _workload_env(self, sdk_path: str) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", **self.user_env, "HOME": WORK,
                "PAL_RESUME": "1" if self.resume else "0", "PAL_HARNESS_SOCKET": sdk_path,
                "PAL_HARNESS_KEY": self.key}

    def _keep_output(self) -> None:
        """The workload's output (a microVM's console) into this log, up to MAX_WORKLOAD_LOG bytes:
        a workload that prints without end fills no disk of the host's."""
        assert self.workload is not None and self.workload.stdout is not None
        kept = 0
        while chunk := os.read(self.workload.stdout.fileno(), 65536):
            self.printed += len(chunk)
            if kept < MAX_WORKLOAD_LOG:
                sys.stderr.buffer.write(chunk[:MAX_WORKLOAD_LOG - kept])
                sys.stderr.buffer.flush()
                kept += len(chunk)
                if kept >= MAX_WORKLOAD_LOG:
                    say(f"the workload's output past {MAX_WORKLOAD_LOG >> 20} MiB is not kept")

    def _watch_microvm(self) -> None:
        """qemu (7.2, emulated) now and then neither boots nor exits: a VM whose console stays empty
        for BOOT_WAIT_S is stopped (it ends as a failed VM, and the sweep starts the next one); one
        whose guest told its exit code is given EXIT_WAIT_S to leave, then stopped."""
        started = time.monotonic()
        while not self.stopped.wait(0.5):
            if not self.printed and time.monotonic() - started > BOOT_WAIT_S:
                self._stop_workload(f"the microVM printed nothing in {BOOT_WAIT_S:g}s")
                return
            if self.exit_code is not None:
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

    def _accept(self, server: socket.socket, session: Any) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=session, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve_lines(conn: socket.socket, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Answer each request line of a connection; a line over MAX_LINE bytes ends it."""
        with conn, conn.makefile("rwb") as stream:
            while line := stream.readline(MAX_LINE + 1):
                if len(line) > MAX_LINE:
                    say(f"a request of more than {MAX_LINE} bytes: connection closed")
                    return
                try:
                    request = json.loads(line)
                except ValueError:
                    request = None
                answer = handle(request) if isinstance(request, dict) else {"ok": False, "error": "not JSON"}
                stream.write(json.dumps(answer).encode() + b"\n")
                stream.flush()

    def _sdk_session(self, conn: socket.socket) -> None:
        self._serve_lines(conn, self._sdk_answer)

    def _sdk_answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if not hmac.compare_digest(str(request.get("key", "")).encode(), self.key.encode()):
            return {"ok": False, "error": "refused: this harness answers its own VM's workload only"}
        try:
            return self._answer(request)
        except Refused as exc:
            self._stop_workload("the control plane refused a step report")
            return {"ok": False, "error": f"refused: {exc}"}
        except (ValueError, ConnectionError, KeyError, TypeError) as exc:
            return {"ok": False, "error": str(exc)}

    def _ctl_session(self, conn: socket.socket) -> None:
        """The guest launcher's channel (qemu's `pal-ctl` port): the launch order, then the exit code."""
        self._serve_lines(conn, self._ctl_answer)

    def _ctl_answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "launch":
            env = self._workload_env("")
            env.pop("PAL_HARNESS_SOCKET")  # the guest names its own port
            return {"command": self.command, "env": env, "resume": self.resume}
        code = request.get("code")
        if request.get("op") == "exit" and isinstance(code, int) and not isinstance(code, bool):
            self.exit_code = max(0, min(code, 255))
            return {"ok": True}
        return {"ok": False, "error": "unknown request"}

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
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
    harness = Harness()
    try:
        return harness.run()
    except (DriverError, OSError) as exc:
        say(f"the VM did not start: {exc}")
        with contextlib.suppress(Refused, ConnectionError, ValueError):
            harness.control.report({"type": "exit", "code": 125, "output": None})
        return 125


if __name__ == "__main__":
    sys.exit(main())
