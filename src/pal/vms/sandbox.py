"""The filesystem a workload sees, and the `namespace` driver's sandbox (docs/isolated-tier.md).

A *view* is a fresh tmpfs root holding, read-only, only what a program needs to run: the system's
`/usr` and libraries, a few files of `/etc`, the Python environment and PAL's own package, and what
the operator adds (PAL_VM_EXPOSE); `/run/pal/work` is the run's work directory, the only writable host
folder. PAL_VM_ROOT, other runs' folders and the rest of the host's files are not in it at all.
The `namespace` driver pivots into the view; `qemu-microvm` shares it with its guest over 9p.

The `namespace` sandbox then drops everything before the workload runs: `setpriv` makes it the
unprivileged PAL_VM_UID with no capabilities (bounding and inheritable sets cleared) and
`no_new_privs`, and pal/vms/confine.py installs the seccomp filter and execs the workload as PID 1
of its own pid namespace.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

from pal.vms import DriverError

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/nsswitch.conf", "/etc/localtime", "/etc/ssl",
       "/etc/ca-certificates", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf",
       "/etc/ld.so.conf.d", "/etc/mime.types")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
SANDBOX_SOCKET = "/run/pal/sdk.sock"  # where the workload finds its harness
WORK = "/run/pal/work"  # where the work directory is, inside the sandbox (no host path is under /run/pal)
_TMP_SIZE = "64m"
# How both sandboxes drop to the workloads' user: no supplementary groups, every capability set
# (inheritable, bounding, hence permitted and effective) empty, no_new_privs; then the filter.
DROP = ("--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
CONFINE = str(Path(__file__).with_name("confine.py"))


def confined(command: list[str], uid: int) -> list[str]:
    """`command` run as `uid` with nothing left to gain, under PAL's seccomp filter."""
    setpriv = shutil.which("setpriv", path=SYSTEM_PATH) or "/usr/bin/setpriv"  # never the workload's PATH
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", *DROP, "--", sys.executable, "-I", "-S", CONFINE,
            *command]


def python_paths() -> list[str]:
    """The interpreter's environment and the folder `pal` is imported from, as the host has them."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    spec = importlib.util.find_spec("pal")
    for package in (spec.submodule_search_locations or []) if spec else []:
        found.add(os.path.dirname(package))
    found |= {os.path.realpath(p) for p in found}
    return sorted(found)


def exposed_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Every host path in a view, read-only, parents before children; missing ones left out."""
    paths = {p for p in (*SYSTEM, *ETC, *python_paths(), *extra) if os.path.lexists(p)}
    for path in paths:
        if path == "/run" or path.startswith("/run/"):
            raise DriverError(f"{path!r} cannot be shown to a sandbox: /run is the sandbox's own")
        if any(c.isspace() or c in "\\'\"," for c in path):
            raise DriverError(f"{path!r} cannot be shown to a sandbox: its name holds a space, comma or "
                              "quote")
    return sorted(paths, key=lambda p: (p.count("/"), p))


def view_script(extra: tuple[str, ...], *, private_tmp: bool) -> str:
    """Shell that makes the view at "$R" (a folder), run as root in a mount namespace of its own.
    With `private_tmp`, /tmp is a tmpfs of the view's (the qemu guest mounts its own instead)."""
    lines = ["mount --make-rprivate /",
             'mount -t tmpfs -o mode=0755,size=16m,nosuid,nodev pal-root "$R"',
             f'mkdir -p "$R/proc" "$R/dev" "$R/sys" "$R/tmp" "$R{WORK}" "$R/run/pal" "$R/.old"']
    if private_tmp:
        lines.append(f'mount -t tmpfs -o mode=1777,size={_TMP_SIZE},nosuid,nodev pal-tmp "$R/tmp"')
    for path in exposed_paths(extra):
        q = shlex.quote(path)
        parent = f'mkdir -p "$(dirname "$R"{q})"'
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin stays a link
            lines.append(f'[ -e "$R"{q} ] || {{ {parent}; ln -s "$(readlink {q})" "$R"{q}; }}')
        else:
            made = f'mkdir -p "$R"{q}' if os.path.isdir(path) else f'{parent} && touch "$R"{q}'
            lines.append(f'{made} && mount --bind {q} "$R"{q} && '
                         f'mount -o remount,bind,ro,nosuid,nodev "$R"{q}')
    return "\n".join(lines)


_NAMESPACE_TAIL = f"""
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
for d in {' '.join(DEVICES)}; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mkdir -p "$R/dev/shm" && mount -t tmpfs -o mode=1777,size={_TMP_SIZE},nosuid,nodev pal-shm "$R/dev/shm"
mount --bind "$W" "$R{WORK}" && mount -o remount,bind,nosuid,nodev "$R{WORK}"
touch "$R{SANDBOX_SOCKET}" && mount --bind "$S" "$R{SANDBOX_SOCKET}"
mount -o remount,ro,bind,nosuid,nodev "$R"
cd "$R" && pivot_root . .old && cd / && umount -l /.old
cd {WORK}
exec "$@"
"""


def namespace_command(command: list[str], *, root: Path, work_fd: int, sdk_socket: Path, uid: int,
                      extra: tuple[str, ...]) -> list[str]:
    """`command` in the namespace sandbox: new pid, mount, network, ipc, uts and cgroup namespaces,
    SIGKILL to all of it when its first process dies."""
    script = ("set -eu\n" f'R={shlex.quote(str(root))}; W=/proc/self/fd/{work_fd}; '
              f'S={shlex.quote(str(sdk_socket))}\n' + view_script(extra, private_tmp=True) + _NAMESPACE_TAIL)
    return ["unshare", "--pid", "--fork", "--net", "--mount", "--ipc", "--uts", "--cgroup", "--mount-proc",
            "--kill-child=SIGKILL", "sh", "-c", script, "pal-sandbox", *confined(command, uid)]
