"""Where a VM host keeps things, and how it touches them (docs/isolated-tier.md).

- A work directory is `PAL_VM_ROOT/<tenant>/<workdir>`, or `PAL_VM_ROOT/<tenant>/.runs/<run>/<workdir>`
  for `"workdirScope": "run"`: tenants naming the same `workdir` never share a folder.
- A VM's own state (its harness's log, the SDK's socket, qemu's console) lives in
  `PAL_VM_ROOT/.state/<vm id>`, owned by root, mode 0700, which no workload sees or can write.
- Every path the host walks below PAL_VM_ROOT is opened one segment at a time without following a
  link, so a workload that plants a symbolic link in its work directory cannot point the host
  elsewhere. Nothing else of a work directory is ever opened by the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from pathlib import Path

from pal.vms import DriverError, Placement

_TENANT_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_RUN_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:.-]{0,127}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def tenant_segment(tenant: str) -> str:
    """The tenant's folder name: the id itself when it is a plain name, else `=` and a digest (a
    plain name never holds `=`, so two tenants never get one folder)."""
    if _TENANT_SEGMENT.fullmatch(tenant):
        return tenant
    return "=" + hashlib.sha256(tenant.encode()).hexdigest()[:40]


def work_segments(tenant: str, run_id: str, workdir: str, scope: str) -> list[str]:
    """The work directory's path below PAL_VM_ROOT, segment by segment (workdir already validated)."""
    segments = [tenant_segment(tenant)]
    if scope == "run":
        run = run_id if _RUN_SEGMENT.fullmatch(run_id) else "=" + hashlib.sha256(run_id.encode()).hexdigest()
        segments += [".runs", run]
    return segments + workdir.split("/")


def place(root: Path, vm_id: str, tenant: str, run_id: str, workdir: str, scope: str) -> Placement:
    """The VM's placement; its state folder is made, its work directory is made by its harness."""
    root = root.absolute()
    return Placement(root, tuple(work_segments(tenant, run_id, workdir, scope)), state_dir(root, vm_id))


def state_dir(root: Path, vm_id: str) -> Path:
    """The VM's private state folder, made fresh (root only)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", vm_id):
        raise DriverError(f"VM id {vm_id[:80]!r} is not a plain name")
    fd = open_dir(root, [".state", vm_id], mode=0o700)
    os.close(fd)
    return root / ".state" / vm_id


def open_dir(root: Path, segments: list[str], *, mode: int = 0o700) -> int:
    """An fd of root/segments..., each segment made (`mode`) when missing and opened without
    following a link. DriverError when a segment is a link or not a folder."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for segment in segments:
            if segment in ("", ".", "..") or "/" in segment:
                raise DriverError(f"{segment!r} is not a folder name")
            with contextlib.suppress(FileExistsError):
                os.mkdir(segment, mode, dir_fd=fd)
            try:
                child = os.open(segment, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                raise DriverError(f"{'/'.join(segments)}: {segment!r} is not a plain folder ({exc.strerror})"
                                  ) from exc
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_work_dir(root: Path, segments: list[str], uid: int, gid: int) -> int:
    """The work directory's fd, made when missing and owned by the workloads' user (its parents
    stay root's, 0700: only the bind mount or the 9p share ever reaches it)."""
    fd = open_dir(root, segments, mode=0o700)
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o700)
    return fd


def create_private(path: Path, *, append: bool = True) -> int:
    """A file of the host's own (a log) opened without following a link: O_NOFOLLOW, 0600."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DriverError(f"{path} is not a regular file")
    return fd
