"""The `firecracker` driver against a local stand-in of Firecracker's API that records each call:
the microVM is configured and started in order, its root drive read-only, the report token
nowhere in what the guest can see; a missing kernel or a refused call is a DriverError with no
process left behind (docs/isolated-tier.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pal.cli.demo import wait_until
from pal.config import load_settings
from pal.storage.vms import VmOrder
from pal.vms import DriverError
from pal.vms.firecracker import FirecrackerDriver
from pal.vms.paths import place

STANDIN = Path(__file__).parents[1] / "support" / "firecracker_standin.py"
TOKEN = "secret-report-token-of-this-vm"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    firecracker = tmp_path / "firecracker"
    firecracker.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} \"$@\"\n")
    firecracker.chmod(0o755)
    (tmp_path / "vmlinux").write_bytes(b"kernel")
    (tmp_path / "rootfs.ext4").write_bytes(b"rootfs")
    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FC_RECORD", str(record))
    monkeypatch.setenv("FC_PIDFILE", str(tmp_path / "firecracker.pid"))
    work = tmp_path / "vm-root"
    return {"bin": firecracker, "kernel": tmp_path / "vmlinux", "rootfs": tmp_path / "rootfs.ext4",
            "record": record, "work": work}


def driver(host: dict[str, Path], **env: str) -> FirecrackerDriver:
    return FirecrackerDriver(load_settings({"PAL_FIRECRACKER_BIN": str(host["bin"]),
                                            "PAL_FIRECRACKER_KERNEL": str(host["kernel"]),
                                            "PAL_FIRECRACKER_ROOTFS": str(host["rootfs"]), **env}))


def order(attempt: int = 2) -> VmOrder:
    return VmOrder("vm_abc", "run-1", attempt, 4, {"kind": "microvm", "command": ["python3", "a.py"],
                                                    "workdir": "w", "driver": "firecracker"})


def calls(host: dict[str, Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in host["record"].read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_the_microvm_is_configured_then_started(host: dict[str, Path]) -> None:
    fc = driver(host)
    pid = fc.spawn(order(), TOKEN, place=place(host["work"], "vm_abc", "acme", "run-1", "w", "tenant"))
    try:
        made = calls(host)
        assert [c["path"] for c in made] == ["/machine-config", "/boot-source", "/drives/rootfs", "/drives/work",
                                            "/vsock", "/actions"]
        assert {c["method"] for c in made} == {"PUT"}
        assert made[-1]["body"] == {"action_type": "InstanceStart"}
        boot = made[1]["body"]
        assert boot["kernel_image_path"] == str(host["kernel"])
        assert "pal.vm=vm_abc" in boot["boot_args"] and "pal.resume=1" in boot["boot_args"]
        assert made[2]["body"]["is_read_only"] is True and made[2]["body"]["is_root_device"] is True
        assert TOKEN not in host["record"].read_text()  # the guest never sees the report token
        # The host's own files (the work image, the vsock's socket) live where no guest can write.
        state = host["work"] / ".state"
        assert Path(made[3]["body"]["path_on_host"]).parent == state / "images"
        assert Path(made[4]["body"]["uds_path"]).parent == state / "vm_abc"
    finally:
        fc.terminate(pid)


def test_a_missing_kernel_is_refused_before_anything_starts(host: dict[str, Path]) -> None:
    fc = driver(host, PAL_FIRECRACKER_KERNEL=str(host["work"] / "nope"))
    with pytest.raises(DriverError, match="PAL_FIRECRACKER_KERNEL"):
        fc.spawn(order(), TOKEN, place=place(host["work"], "vm_abc", "acme", "run-1", "w", "tenant"))
    assert not host["record"].exists()


def test_a_refused_call_stops_the_vm(host: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FC_FAIL_PATH", "/vsock")
    fc = driver(host)
    with pytest.raises(DriverError, match="PUT /vsock: HTTP 400"):
        fc.spawn(order(), TOKEN, place=place(host["work"], "vm_abc", "acme", "run-1", "w", "tenant"))
    assert [c["path"] for c in calls(host)][-1] == "/vsock"  # InstanceStart was never sent
    pid = int((host["record"].parent / "firecracker.pid").read_text())
    assert wait_until(lambda: not alive(pid), timeout=10)  # the half-made VM was stopped
