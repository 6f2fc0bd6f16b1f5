"""The isolated tier's pure decisions (pal.core.vms): resumeMicroVMRun's table and the refusals of
hostile microVM run documents."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pal.core.vms import MAX_MICROVM_RESUME_ATTEMPTS, ResumeAction, microvm_problems, resume_action
from pal.harness import host_tsc_khz, kept_under_tmp, microvm


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


@pytest.mark.parametrize(("change", "fragment"), [
    ({"workdir": "/etc"}, "must be relative to PAL_VM_ROOT"),
    ({"workdir": "a/../../etc"}, "must be relative to PAL_VM_ROOT"),
    ({"workdir": "~root"}, "must be relative to PAL_VM_ROOT"),
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
    monkeypatch.setenv("PAL_VM_GUEST", str(tmp_path))
    monkeypatch.setenv("PAL_VM_ACCEL", accel)
    monkeypatch.setattr("pal.harness.host_tsc_khz", lambda: 2100000)
    command = microvm(tmp_path, tmp_path / "harness.sock", "1")
    kernel_line = command[command.index("-append") + 1].split()
    assert ("tsc_early_khz=2100000" in kernel_line) == (accel == "tcg")
    assert command[command.index("-M") + 1] == f"microvm,accel={accel}"
