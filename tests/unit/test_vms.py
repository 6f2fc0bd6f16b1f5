"""The isolated tier's pure decisions (pal.core.vms): resumeMicroVMRun's table and the refusals of
hostile microVM run documents."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pal.core.vms import MAX_MICROVM_RESUME_ATTEMPTS, ResumeAction, microvm_problems, resume_action
from pal.harness import kept_under_tmp


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
