"""The isolated tier's vocabulary and decisions, pure (docs/isolated-tier.md).

A run document `{"kind": "microvm", "command": [...], "workdir": "...", "env": {...}, "driver"?,
"workdirScope"?, "memoryMb"?, "cpus"?, "pids"?}` runs a program, not a graph, in a VM of its own;
the program journals its steps through the SDK
(`pal.sdk`) and the harness (`pal.harness`). The sweep resumes an orphaned microVM run by the
specification's `resumeMicroVMRun`: skip a run with a live VM, fail it `microvm_resume_exhausted`
after MAX_MICROVM_RESUME_ATTEMPTS VMs, otherwise spawn a new VM with PAL_RESUME=1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MAX_MICROVM_RESUME_ATTEMPTS = 3  # maxMicroVMResumeAttempts: VMs ever spawned for one run
DRIVERS = ("namespace", "qemu-microvm", "firecracker")
DEFAULT_DRIVER = "namespace"
_MAX_ARGS = 64
_MAX_ARG_CHARS = 4096
_MAX_ENV = 64
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
_RESERVED_ENV = ("PAL_", "LD_", "PYTHON")  # the harness's own, and what would subvert the interpreter
# A work directory's segments: a strict set, so a path is never `.`/`..`, never hidden, and goes into
# a qemu option, a kernel command line or a mount without escaping surprises (no comma, space, colon).
WORKDIR_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MAX_WORKDIR_SEGMENTS = 8
WORKDIR_SCOPES = ("tenant", "run")  # PAL_VM_ROOT/<tenant>/<workdir>, or one of the run's own
_KEYS = ("kind", "command", "workdir", "env", "driver", "workdirScope", "memoryMb", "cpus", "pids")


@dataclass(frozen=True)
class Resources:
    """What one VM may use; a VM host refuses a VM over its own caps (PAL_VM_MAX_*)."""

    memory_mb: int = 512
    cpus: float = 1.0
    pids: int = 256


# The bounds a document may ask for at all, whatever a host allows.
RESOURCE_BOUNDS: dict[str, tuple[float, float]] = {"memoryMb": (64, 65536), "cpus": (0.1, 64),
                                                   "pids": (16, 65536)}


class VmState(StrEnum):
    PENDING = "pending"  # its row exists; no host has taken it yet
    BOOTING = "booting"  # a host took it and is starting the harness
    RUNNING = "running"
    TERMINATED = "terminated"  # ended: exited, or lost with its host
    FAILED = "failed"  # the workload exited with an error

    @property
    def live(self) -> bool:
        return self in (VmState.PENDING, VmState.BOOTING, VmState.RUNNING)


LIVE_STATES = tuple(s for s in VmState if s.live)


class ResumeAction(StrEnum):
    SKIP = "skip"  # a live VM exists: it manages itself
    EXHAUSTED = "exhausted"  # the run fails microvm_resume_exhausted
    RESPAWN = "respawn"  # a new VM, with PAL_RESUME=1


def resume_action(live_vm: bool, attempts: int) -> ResumeAction:
    """resumeMicroVMRun's decision for an orphaned run with `attempts` VMs ever spawned."""
    if live_vm:
        return ResumeAction.SKIP
    if attempts >= MAX_MICROVM_RESUME_ATTEMPTS:
        return ResumeAction.EXHAUSTED
    return ResumeAction.RESPAWN


@dataclass(frozen=True)
class VmSpec:
    command: tuple[str, ...]
    workdir: str  # relative to the VM host's PAL_VM_ROOT
    env: Mapping[str, str]
    driver: str
    workdir_scope: str = "tenant"
    resources: Resources = Resources()

    def document(self) -> dict[str, Any]:
        return {"kind": "microvm", "command": list(self.command), "workdir": self.workdir,
                "env": dict(self.env), "driver": self.driver, "workdirScope": self.workdir_scope,
                "memoryMb": self.resources.memory_mb, "cpus": self.resources.cpus,
                "pids": self.resources.pids}


def is_microvm_document(document: Any) -> bool:
    return isinstance(document, Mapping) and document.get("kind") == "microvm"


def microvm_problems(document: Mapping[str, Any]) -> list[str]:
    """Every problem of a microVM run document; empty when it is valid."""
    problems = [f"unknown key {k!r} (allowed: {', '.join(_KEYS)})" for k in document if k not in _KEYS]
    command = document.get("command")
    if (not isinstance(command, list) or not command or len(command) > _MAX_ARGS
            or not all(_is_argument(a) for a in command)):
        problems.append(f"'command' must be a list of 1 to {_MAX_ARGS} non-empty strings")
    problems.extend(_workdir_problems(document.get("workdir")))
    env = document.get("env", {})
    if not isinstance(env, Mapping) or len(env) > _MAX_ENV:
        problems.append(f"'env' must be an object of at most {_MAX_ENV} variables")
    else:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(str(name)) or str(name).startswith(_RESERVED_ENV):
                problems.append(f"env {name!r}: names are [A-Z_][A-Z0-9_]*, and PAL_*, LD_* and PYTHON* "
                                "are reserved")
            elif not isinstance(value, str) or len(value) > _MAX_ARG_CHARS or "\0" in value:
                problems.append(f"env {name!r} must be a string of at most {_MAX_ARG_CHARS} characters")
    if document.get("driver", DEFAULT_DRIVER) not in DRIVERS:
        problems.append(f"'driver' must be one of {', '.join(DRIVERS)}, not {document.get('driver')!r}")
    if document.get("workdirScope", "tenant") not in WORKDIR_SCOPES:
        problems.append(f"'workdirScope' must be one of {', '.join(WORKDIR_SCOPES)}")
    for key, (low, high) in RESOURCE_BOUNDS.items():
        value = document.get(key)
        whole = key != "cpus"
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or (whole and not isinstance(value, int)) or not low <= value <= high):
            kind = "an integer" if whole else "a number"
            problems.append(f"'{key}' must be {kind} from {low:g} to {high:g}")
    return problems


def _is_argument(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_ARG_CHARS and "\0" not in value


def _workdir_problems(workdir: Any) -> list[str]:
    """A work directory is 1-8 `/`-separated segments, each a letter or digit followed by up to 63
    letters, digits, `_`, `.` or `-`: never absolute, never `.`, `..` or empty, nothing a mount or a
    qemu option would read as syntax. The host puts it under PAL_VM_ROOT/<tenant>."""
    if not isinstance(workdir, str) or not workdir or len(workdir) > 256:
        return ["'workdir' must be a relative path of 1 to 256 characters"]
    segments = workdir.split("/")
    if len(segments) > _MAX_WORKDIR_SEGMENTS or not all(WORKDIR_SEGMENT.fullmatch(s) for s in segments):
        return [f"'workdir' {workdir[:80]!r} must be 1 to {_MAX_WORKDIR_SEGMENTS} '/'-separated names, "
                "each a letter or digit then letters, digits, '_', '.' or '-' (no '.', '..', empty names, "
                "spaces, commas or control characters)"]
    return []


def parse_spec(document: Mapping[str, Any]) -> VmSpec:
    """The spec of a validated document."""
    return VmSpec(command=tuple(document["command"]), workdir=str(document["workdir"]),
                  env={str(k): str(v) for k, v in (document.get("env") or {}).items()},
                  driver=str(document.get("driver", DEFAULT_DRIVER)),
                  workdir_scope=str(document.get("workdirScope", "tenant")), resources=resources_of(document))


def resources_of(document: Mapping[str, Any]) -> Resources:
    """What a validated document asks for, the defaults where it says nothing."""
    defaults = Resources()
    return Resources(memory_mb=int(document.get("memoryMb", defaults.memory_mb)),
                     cpus=float(document.get("cpus", defaults.cpus)),
                     pids=int(document.get("pids", defaults.pids)))
