"""The last step before a workload runs: `python -I -S confine.py COMMAND...` (docs/isolated-tier.md).

Run inside the sandbox as the workloads' unprivileged user with no capabilities (setpriv), it sets
`no_new_privs`, installs a seccomp filter refusing the system calls a sandboxed program has no use
for and an escape would need, then execs COMMAND. Standard library only, started by file path:
it runs before anything of PAL's is imported, so nothing of PAL's is trusted after the filter.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import struct
import sys

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_KILL_PROCESS = 0x80000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# clone() flags that make a namespace: a new user namespace would give the workload capabilities again.
_NAMESPACE_FLAGS = 0x7E020080
_CLONE, _CLONE3 = 56, 435

# x86_64 numbers of the refused calls: mounts and root changes, namespaces, tracing other processes,
# kernel keys, BPF, modules, kexec, perf, userfaultfd, handles that bypass paths, clocks, swap, reboot.
REFUSED = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "syslog": 103, "quotactl": 179,
    "iopl": 172, "ioperm": 173, "vhangup": 153, "lookup_dcookie": 212, "uselib": 134,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442,
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def filter_program() -> bytes:
    """The classic-BPF program: other architectures and the x32 ABI are refused outright."""
    refused = sorted(REFUSED.values())
    # Layout: [arch check (3)] [load nr] [x32] [each refused] [clone3] [clone, flags (3)] ALLOW EPERM ENOSYS
    head = 3 + 1 + 1
    allow = head + len(refused) + 1 + 3
    eperm, enosys = allow + 1, allow + 2
    prog = [_op(_LD_ABS_W, 4), _op(_JEQ, _AUDIT_ARCH_X86_64, jt=1), _op(_RET, _RET_KILL_PROCESS),
            _op(_LD_ABS_W, 0), _op(_JGE, _X32_BIT, jt=eperm - 5)]
    for nr in refused:
        at = len(prog)
        prog.append(_op(_JEQ, nr, jt=eperm - at - 1))
    at = len(prog)
    prog.append(_op(_JEQ, _CLONE3, jt=enosys - at - 1))  # ENOSYS: libc falls back to clone, checked next
    at = len(prog)
    prog.append(_op(_JEQ, _CLONE, jf=allow - at - 1))
    prog.append(_op(_LD_ABS_W, 16))  # the low half of clone's flags
    at = len(prog)
    prog.append(_op(_JSET, _NAMESPACE_FLAGS, jt=eperm - at - 1, jf=allow - at - 1))
    prog += [_op(_RET, _RET_ALLOW), _op(_RET, _RET_ERRNO | errno.EPERM), _op(_RET, _RET_ERRNO | errno.ENOSYS)]
    assert len(prog) == enosys + 1
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    if platform.machine() != "x86_64":
        raise OSError(errno.ENOSYS, f"PAL's seccomp filter knows x86_64 only, not {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    program = filter_program()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: confine.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        install()
    except OSError as exc:
        print(f"pal-sandbox: the seccomp filter was not installed: {exc}", file=sys.stderr)
        return 126
    # The workload's environment, handed over past the root shell that made the sandbox.
    handed = os.environ.pop("PAL_SANDBOX_ENV", None)
    env = json.loads(handed) if handed else dict(os.environ)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"pal-sandbox: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
