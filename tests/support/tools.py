"""Tools for tests. Their effects land in files, so a test can count calls across processes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from pal.tools import tool


def record_call(path: str, label: str) -> None:
    """Append one line per call; O_APPEND keeps concurrent writers from interleaving lines."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{label}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@tool(name="count")
def count(path: str, label: str, value: Any = None) -> dict[str, Any]:
    """Record the call, return what it was given."""
    record_call(path, label)
    return {"label": label, "value": value}


@tool(name="explode")
def explode(message: str = "boom") -> None:
    raise RuntimeError(message)


@tool(name="nap")
def nap(seconds: float, path: str | None = None, label: str = "nap") -> float:
    """Sleep; with `path`, record the call first, so a test knows the nap has begun."""
    if path is not None:
        record_call(path, label)
    time.sleep(min(float(seconds), 30.0))
    return float(seconds)


@tool(name="anap")
async def anap(seconds: float, path: str | None = None, label: str = "anap") -> dict[str, Any]:
    """`nap`, awaited: with `path`, records its start, and `<label>:stopped` if it is cancelled (a
    time limit, a cancelled run); returns the event loop's thread, to tell where it ran."""
    if path is not None:
        record_call(path, label)
    try:
        await asyncio.sleep(min(float(seconds), 30.0))
    except asyncio.CancelledError:
        if path is not None:
            record_call(path, f"{label}:stopped")
        raise
    return {"slept": float(seconds), "thread": threading.current_thread().name}


@tool(name="aexplode")
async def aexplode(message: str = "boom", path: str | None = None, label: str = "aexplode") -> None:
    """An awaited tool that fails (each call recorded with `path`)."""
    if path is not None:
        record_call(path, label)
    await asyncio.sleep(0)
    raise RuntimeError(message)


@tool(name="anot_json")
async def anot_json() -> Any:
    await asyncio.sleep(0)
    return {1, 2, 3}


@tool(name="not_json")
def not_json() -> Any:
    return {1, 2, 3}


@tool(name="flaky")
def flaky(path: str, label: str, failures: int, error: str = "tool") -> dict[str, Any]:
    """Fail the first `failures` calls (counted in `path`), then succeed: a flaky dependency.
    `error="timeout"` fails with a TimeoutError (retry class `timeout`) instead of a tool error."""
    record_call(path, label)
    made = calls(Path(path)).count(label)
    if made <= failures:
        if error == "timeout":
            raise TimeoutError(f"{label}: call {made} timed out")
        raise RuntimeError(f"{label}: call {made} failed")
    return {"label": label, "calls": made}


@tool(name="blob")
def blob(size: int) -> dict[str, Any]:
    """An output of about `size` bytes: a tool that returns far too much."""
    return {"data": "x" * int(size)}


@tool(name="deep")
def deep(depth: int) -> Any:
    """An output nested `depth` lists deep."""
    value: Any = 1
    for _ in range(int(depth)):
        value = [value]
    return value


@tool(name="spin")
def spin(seconds: float) -> float:
    """Busy Python work for up to `seconds` (at most 120): a runaway step that never sleeps."""
    end = time.monotonic() + min(float(seconds), 120.0)
    n = 0
    while time.monotonic() < end:
        n += 1
    return float(seconds)
