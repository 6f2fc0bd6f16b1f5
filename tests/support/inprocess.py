"""Clients standing for worker processes in this test process: each keeps its own journal caches
(step logs) and its own outbox instead of the broker, so tests deliver messages to one or another."""

from __future__ import annotations

from collections.abc import Iterator

from pal.client import Client
from pal.engine.steps import execute_step
from tests.conftest import Backend

Message = tuple[str, str, int]  # run, step, generation


class Process:
    """A Client standing for one worker process, with its own outbox instead of the broker."""

    def __init__(self, backend: Backend) -> None:
        self.client = Client(backend.settings)
        self.outbox: list[Message] = []
        self.client.runtime.publish = lambda run_id, step_id, generation, countdown=0.0: (
            self.outbox.append((run_id, step_id, generation)))

    def deliver(self, message: Message) -> str:
        return execute_step(self.client.runtime, *message).outcome

    def take(self, step_id: str) -> Message:
        """The one message of the outbox for `step_id`, removed from it."""
        [message] = [m for m in self.outbox if m[1] == step_id]
        self.outbox.remove(message)
        return message


def two_processes(backend: Backend) -> Iterator[tuple[Process, Process]]:
    a, b = Process(backend), Process(backend)
    yield a, b
    b.client.close()
    a.client.close()
