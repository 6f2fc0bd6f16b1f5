"""The isolated tier's SDK for workloads written as programs (docs/isolated-tier.md).

    from pal import sdk

    @sdk.step("fetch")
    def fetch() -> dict:
        ...

Each call of a step journals it through the VM's harness (`step_started`, then `step_completed`
with its return value). On a resume (`PAL_RESUME=1`: the sweep started a new VM after the last one
died) a step that already completed is not run again: the call returns its saved output from the
journal, so the workload skips completed work without writing that logic itself. Outside a VM (no
harness) a step simply runs. A step's name must be unique within the run, and its return value
JSON. Standard library only: the SDK runs inside the sandbox.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class HarnessError(RuntimeError):
    """The harness refused or failed a request (this VM no longer holds the run, a bad output)."""


def is_resume() -> bool:
    """Whether this process runs a re-drive of the run (PAL_RESUME=1)."""
    return os.environ.get("PAL_RESUME") == "1"


class _Harness:
    def __init__(self, path: str) -> None:
        self._stream: Any
        if path.startswith("/dev/"):  # in a microVM: the virtio-serial port to the harness
            self._stream = open(path, "r+b", buffering=0)  # noqa: SIM115 (held for the process)
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(path)
            self._stream = self._sock.makefile("rwb")
        self._lock = threading.Lock()
        self.completed: dict[str, Any] | None = None

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        # The VM's own key: its harness answers no one else (another sandbox, a stray process).
        request = {**request, "key": os.environ.get("PAL_HARNESS_KEY", "")}
        with self._lock:
            self._stream.write(json.dumps(request).encode() + b"\n")
            self._stream.flush()
            answer: dict[str, Any] = json.loads(self._stream.readline() or b"{}")
        if not answer.get("ok"):
            raise HarnessError(str(answer.get("error", "the harness did not answer")))
        return answer


_harness: _Harness | None = None
_harness_lock = threading.Lock()


def _connected() -> _Harness | None:
    global _harness
    path = os.environ.get("PAL_HARNESS_SOCKET")
    if not path:
        return None
    with _harness_lock:
        if _harness is None:
            _harness = _Harness(path)
        return _harness


def completed() -> dict[str, Any]:
    """The saved outputs of the run's completed steps (read once per process); empty outside a VM."""
    harness = _connected()
    if harness is None:
        return {}
    if harness.completed is None:
        harness.completed = dict(harness.ask({"op": "completed"}).get("steps") or {})
    return harness.completed


def run_step(name: str, fn: Callable[[], T]) -> T:
    """Run `fn` as the step `name`, or return its saved output when it already completed."""
    harness = _connected()
    if harness is None:
        return fn()
    saved = completed()
    if name in saved:
        return saved[name]  # type: ignore[no-any-return]
    harness.ask({"op": "step", "step_id": name, "event": "started"})
    try:
        value = fn()
    except Exception as exc:
        harness.ask({"op": "step", "step_id": name, "event": "failed",
                     "error": f"{type(exc).__name__}: {exc}"})
        raise
    harness.ask({"op": "step", "step_id": name, "event": "completed", "output": value})
    saved[name] = value
    return value


def step(name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a function as the journaled step `name` (see the module's docstring)."""
    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return run_step(name, lambda: fn(*args, **kwargs))
        return wrapper
    return decorate


def set_output(value: Any) -> None:
    """The run's output, reported when the workload exits with 0."""
    harness = _connected()
    if harness is not None:
        harness.ask({"op": "output", "output": value})
