"""The isolated tier's pure decisions (pal.core.vms): resumeMicroVMRun's table and the refusals of
hostile microVM run documents."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from pal.core.vms import MAX_MICROVM_RESUME_ATTEMPTS, ResumeAction, microvm_problems, resume_action
from pal.vms.qemu import host_tsc_khz, kept_under_tmp, microvm


@pytest.mark.parametrize(("live", "attempts", "action"), [
    (False, 0, ResumeAction.RESPAWN), (False, 1, ResumeAction.RESPAWN), (False, 2, ResumeAction.RESPAWN),
    (False, 3, ResumeAction.EXHAUSTED), (False, 7, ResumeAction.EXHAUSTED),
    (True, 1, ResumeAction.SKIP), (True, 3, ResumeAction.SKIP),
])
def test_resume_decision_table(live: bool, attempts: int, action: ResumeAction) -> None:
    assert MAX_MICROVM_RESUME_ATTEMPTS == 3
    assert resume_action(live, attempts) is action


GOOD: dict[str, Any] = {"kind": "microvm", "command": ["python3", "agent.py"], "workdir": "agents/a1",
                        "env": {"MODE": "fast"}}


def test_a_good_document_has_no_problems() -> None:
    assert microvm_problems(GOOD) == []
    assert microvm_problems(GOOD | {"workdirScope": "run", "memoryMb": 256, "cpus": 0.5, "pids": 64,
                                    "workdir": "a-1/b_2/c.3"}) == []


@pytest.mark.parametrize(("change", "fragment"), [
    ({"workdir": "/etc"}, "'/'-separated names"),
    ({"workdir": "a/../../etc"}, "'/'-separated names"),
    ({"workdir": "~root"}, "'/'-separated names"),
    ({"workdir": "."}, "'/'-separated names"),
    ({"workdir": "a/./b"}, "'/'-separated names"),
    ({"workdir": "a//b"}, "'/'-separated names"),
    ({"workdir": "a/"}, "'/'-separated names"),
    ({"workdir": ".pal"}, "'/'-separated names"),
    ({"workdir": "x,path=.."}, "'/'-separated names"),
    ({"workdir": "a b"}, "'/'-separated names"),
    ({"workdir": "a\nb"}, "'/'-separated names"),
    ({"workdir": "a\x7fb"}, "'/'-separated names"),
    ({"workdir": "a:b"}, "'/'-separated names"),
    ({"workdir": "/".join("a" * 9)}, "'/'-separated names"),
    ({"workdirScope": "host"}, "'workdirScope' must be one of tenant, run"),
    ({"memoryMb": 10**9}, "'memoryMb' must be an integer from 64 to 65536"),
    ({"memoryMb": 512.5}, "'memoryMb' must be an integer"),
    ({"memoryMb": True}, "'memoryMb' must be an integer"),
    ({"cpus": 0}, "'cpus' must be a number from 0.1 to 64"),
    ({"cpus": "2"}, "'cpus' must be a number"),
    ({"pids": 1}, "'pids' must be an integer from 16 to 65536"),
    ({"workdir": ""}, "'workdir' must be a relative path"),
    ({"command": []}, "'command' must be a list"),
    ({"command": "python3 agent.py"}, "'command' must be a list"),
    ({"command": ["python3", "a\0b"]}, "'command' must be a list"),
    ({"command": ["x"] * 65}, "'command' must be a list"),
    ({"env": {"PAL_VM_TOKEN": "stolen"}}, "are reserved"),
    ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "are reserved"),
    ({"env": {"PYTHONPATH": "/tmp"}}, "are reserved"),
    ({"env": {"lower": "x"}}, "are reserved"),
    ({"env": {"MODE": 3}}, "must be a string"),
    ({"driver": "docker"}, "'driver' must be one of namespace, qemu-microvm, firecracker"),
    ({"extra": 1}, "unknown key 'extra'"),
])
def test_a_hostile_document_is_refused_by_name(change: dict[str, Any], fragment: str) -> None:
    problems = microvm_problems(GOOD | change)
    assert any(fragment in p for p in problems), problems


def test_the_vm_settings_refuse_a_bad_accelerator_by_name() -> None:
    from pal.config import load_settings
    from pal.errors import ConfigError

    assert load_settings({}).vm_accel == "kvm" and load_settings({"PAL_VM_ACCEL": "TCG"}).vm_accel == "tcg"
    with pytest.raises(ConfigError, match="PAL_VM_ACCEL='hvf' must be one of kvm, tcg"):
        load_settings({"PAL_VM_ACCEL": "hvf"})


def test_a_guest_keeps_seeing_a_python_environment_that_lives_under_the_hosts_tmp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The guest mounts its own tmpfs on /tmp; a checkout or virtualenv under the host's /tmp (a CI
    # clone there) must be bound back, or its Python cannot start in the guest.
    monkeypatch.setattr(sys, "prefix", "/tmp/ci-clone/.venv")
    kept = kept_under_tmp().split(":")
    assert "/tmp/ci-clone/.venv" in kept
    monkeypatch.setattr(sys, "prefix", "/opt/venv")
    assert all(path.startswith("/tmp/") for path in kept_under_tmp().split(":") if path)


CPUINFO = "processor\t: 0\ncpu MHz\t\t: 1996.249\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n"


@pytest.mark.parametrize(("text", "khz"), [
    (CPUINFO, 1996249),
    (CPUINFO.replace(" constant_tsc", ""), None),  # a TSC whose rate varies: no rate to tell
    (CPUINFO.replace("1996.249", "fast"), None),
    (CPUINFO.replace("cpu MHz", "bogomips"), None),
    ("", None),
])
def test_the_hosts_tsc_rate_is_read_only_where_the_host_states_a_constant_one(
        tmp_path: Path, text: str, khz: int | None) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert host_tsc_khz(str(cpuinfo)) == khz
    assert host_tsc_khz(str(tmp_path / "absent")) is None


@pytest.mark.parametrize("accel", ["tcg", "kvm"])
def test_an_emulated_microvm_is_told_the_tsc_rate_and_a_kvm_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accel: str) -> None:
    # An emulated guest cannot measure its TSC on a microVM (no PIT, HPET or PM timer); some hosts'
    # emulated CPUID does not say it, and the guest then never boots (docs/isolated-tier.md).
    monkeypatch.setattr("pal.vms.qemu.host_tsc_khz", lambda: 2100000)
    command = _microvm(tmp_path, accel)
    kernel_line = command[command.index("-append") + 1].split()
    assert ("tsc_early_khz=2100000" in kernel_line) == (accel == "tcg")
    assert command[command.index("-M") + 1] == f"microvm,accel={accel}"


def _microvm(tmp_path: Path, accel: str = "tcg", state: Path | None = None) -> list[str]:
    state = state or tmp_path
    return microvm(guest=tmp_path, view=state / "root", work_fd=5, sdk_socket=state / "sdk.sock",
                   ctl_socket=state / "ctl.sock", accel=accel, memory_mb=512, cpus=1, uid=100000, extra=())


def test_a_comma_in_a_host_path_stays_inside_its_qemu_option(tmp_path: Path) -> None:
    # qemu reads `,` as the start of the next option: `x,path=..` would add a second path (qemu keeps
    # the last). A doubled comma is a literal one.
    state = tmp_path / "a,path=..,b"
    command = _microvm(tmp_path, state=state)
    fsdev = command[command.index("-fsdev") + 1]
    assert [v for k, v in _qemu_options(fsdev) if k == "path"] == [f"{state}/root"]
    sockets = [command[i + 1] for i, a in enumerate(command) if a == "-chardev"]
    assert [[v for k, v in _qemu_options(s) if k == "path"] for s in sockets] == [
        [f"{state}/sdk.sock"], [f"{state}/ctl.sock"]]


def _qemu_options(text: str) -> list[tuple[str, str]]:
    """qemu's reading of an option string: `,` separates, `,,` is a literal comma."""
    parts, current, i = [], "", 0
    while i < len(text):
        if text[i] == ",":
            if text[i + 1:i + 2] == ",":
                current, i = current + ",", i + 2
                continue
            parts.append(current)
            current = ""
        else:
            current += text[i]
        i += 1
    parts.append(current)
    return [(k, v) for k, _, v in (p.partition("=") for p in parts)]


def test_no_host_path_with_a_space_reaches_the_kernel_command_line(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from pal.vms import DriverError

    monkeypatch.setattr(sys, "executable", "/opt/py 3/bin/python rdinit=/bin/sh")
    with pytest.raises(DriverError, match="cannot go on a kernel command line"):
        _microvm(tmp_path)


@pytest.mark.parametrize(("env", "fragment"), [
    ({"PAL_VM_UID": "0"}, "PAL_VM_UID='0' must be positive"),  # never root
    ({"PAL_VM_UID": "-1"}, "must be positive"),
    ({"PAL_VM_UID": "root"}, "not a whole number"),
    ({"PAL_VM_MAX_MEMORY_MB": "0"}, "must be positive"),
    ({"PAL_VM_MAX_CPUS": "nan"}, "must be positive and finite"),
    ({"PAL_VM_MAX_PIDS": "lots"}, "not a whole number"),
    ({"PAL_VM_EXPOSE": "relative/tools"}, "must be an absolute path"),
    ({"PAL_VM_EXPOSE": "/opt/a:/srv/../etc"}, "must be an absolute path without '..'"),
    ({"PAL_VM_EXPOSE": "/opt/my tools"}, "spaces, commas"),
    ({"PAL_VM_EXPOSE": "/opt/a,path=/"}, "spaces, commas"),
])
def test_the_vm_host_settings_refuse_what_would_weaken_a_sandbox(env: dict[str, str], fragment: str) -> None:
    from pal.config import load_settings
    from pal.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_settings(env)


def test_a_vm_over_its_hosts_caps_is_refused_before_anything_starts() -> None:
    from pal.config import load_settings
    from pal.vms import DriverError
    from pal.vms.harnessed import within_host_caps

    settings = load_settings({"PAL_VM_MAX_MEMORY_MB": "1024", "PAL_VM_MAX_CPUS": "2", "PAL_VM_MAX_PIDS": "100"})
    assert within_host_caps(GOOD | {"memoryMb": 1024, "cpus": 2, "pids": 100}, settings).memory_mb == 1024
    for over, fragment in (({"memoryMb": 1025}, "memoryMb 1025 (this host allows at most 1024, PAL_VM_MAX_MEMORY_MB)"),
                           ({"cpus": 2.5}, "cpus 2.5"), ({"pids": 101}, "pids 101")):
        with pytest.raises(DriverError, match=re.escape(fragment)):
            within_host_caps(GOOD | over, settings)
