"""A VM host's paths (pal.vms.paths) and the sandbox's filter (pal.vms.confine), on real folders:
tenants never share a work directory, a planted link or file stops the walk before the host follows
it, the host's own files are made without following a link, and the seccomp program refuses what it
names (docs/isolated-tier.md)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from pal.vms import DriverError
from pal.vms.confine import REFUSED, filter_program
from pal.vms.paths import create_private, open_dir, open_work_dir, place, tenant_segment, work_segments


@pytest.mark.parametrize(("a", "b"), [("acme", "globex"), ("acme", "Acme"), ("a/b", "a_b"), ("..", "."),
                                      ("x y", "x-y"), ("", "=")])
def test_two_tenants_never_get_one_folder(a: str, b: str) -> None:
    assert tenant_segment(a) != tenant_segment(b)
    for tenant in (a, b):
        segment = tenant_segment(tenant)
        assert segment not in ("", ".", "..") and "/" not in segment and not segment.startswith(".")


def test_a_run_scoped_workdir_is_the_runs_own() -> None:
    assert work_segments("acme", "run-1", "a/b", "tenant") == ["acme", "a", "b"]
    assert work_segments("acme", "run-1", "a/b", "run") == ["acme", ".runs", "run-1", "a", "b"]
    assert work_segments("acme", "run-2", "a/b", "run") != work_segments("acme", "run-1", "a/b", "run")


def test_the_walk_refuses_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "host-folder"
    target.mkdir(mode=0o755)
    before = target.stat()
    (root / "acme" / "w").mkdir(parents=True)
    (root / "acme" / "w" / "sub").symlink_to(target)
    with pytest.raises(DriverError, match="'sub' is not a plain folder"):
        open_work_dir(root, ["acme", "w", "sub"], os.getuid(), os.getgid())
    after = target.stat()  # neither chowned nor chmodded through the link
    assert list(target.iterdir()) == [] and (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)
    (root / "acme" / "file").write_text("x")
    with pytest.raises(DriverError, match="'file' is not a plain folder"):
        open_dir(root, ["acme", "file", "x"])
    with pytest.raises(DriverError, match="is not a folder name"):
        open_dir(root, ["acme", ".."])


def test_a_work_directory_is_made_private_to_the_workloads_user(tmp_path: Path) -> None:
    fd = open_work_dir(tmp_path / "root", ["acme", "a", "b"], os.getuid(), os.getgid())
    try:
        made = tmp_path / "root" / "acme" / "a" / "b"
        assert os.path.samestat(os.fstat(fd), made.stat())
        assert made.stat().st_mode & 0o777 == 0o700 and (tmp_path / "root" / "acme").stat().st_mode & 0o077 == 0
    finally:
        os.close(fd)


def test_the_state_folder_is_apart_from_every_work_directory(tmp_path: Path) -> None:
    placed = place(tmp_path / "root", "vm_1", "acme", "run-1", "w", "tenant")
    assert placed.state == tmp_path / "root" / ".state" / "vm_1" and placed.state.stat().st_mode & 0o777 == 0o700
    with pytest.raises(DriverError, match="is not a plain name"):
        place(tmp_path / "root", "../vm", "acme", "run-1", "w", "tenant")


def test_a_host_log_is_never_opened_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "harness.log").symlink_to(target)
    with pytest.raises(OSError):
        create_private(tmp_path / "harness.log")
    assert not target.exists()
    fd = create_private(tmp_path / "fresh.log")
    os.close(fd)
    assert (tmp_path / "fresh.log").stat().st_mode & 0o777 == 0o600


def _run(program: bytes, nr: int, arch: int = 0xC000003E, arg0: int = 0) -> int:
    """A classic-BPF interpreter of the instructions the filter uses, over one seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    ops = [struct.unpack("HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


def test_the_filter_refuses_what_it_names_and_allows_the_rest() -> None:
    program = filter_program()
    eperm, allow = 0x00050000 | 1, 0x7FFF0000
    for name, nr in REFUSED.items():
        assert _run(program, nr) == eperm, name
    for nr in (0, 1, 2, 9, 57, 59, 231):  # read, write, open, mmap, fork, execve, exit_group
        assert _run(program, nr) == allow
    assert _run(program, 56, arg0=0x01200011) == allow  # clone as fork() makes it
    assert _run(program, 56, arg0=0x10000000) == eperm  # clone(CLONE_NEWUSER)
    assert _run(program, 435) == 0x00050000 | 38  # clone3: ENOSYS, so libc falls back to clone
    assert _run(program, 0x40000000 | 1) == eperm  # the x32 ABI
    assert _run(program, 0, arch=0x40000003) == 0x80000000  # another architecture: killed
