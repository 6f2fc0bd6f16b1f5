"""The waiting-steps benchmark's tool (bench/waiting.py): a step that waits, as on a model call."""

from __future__ import annotations

import time

from pal.tools import tool


@tool(name="bench_wait")
def bench_wait(seconds: float = 1.0) -> float:
    time.sleep(min(float(seconds), 10.0))
    return float(seconds)
