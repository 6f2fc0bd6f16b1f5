"""Running a run's steps in the test's own thread: the runtime's publishes are captured in an
outbox instead of reaching a broker, and `drain` executes them one by one (bounded)."""

from __future__ import annotations

from pal.client import Client
from pal.engine.steps import execute_step

Outbox = list[tuple[str, str, int]]


def capture_publishes(client: Client) -> Outbox:
    sent: Outbox = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    return sent


def drain(client: Client, sent: Outbox, most: int = 5_000) -> None:
    for _ in range(most):  # bounded: a runaway here is a failure, not a hang
        if not sent:
            return
        execute_step(client.runtime, *sent.pop(0))
    raise AssertionError("the run did not stop")
