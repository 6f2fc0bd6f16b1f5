"""The attempt number is durable: a worker SIGKILLed between attempts does not restart at 1."""

from __future__ import annotations

import signal
from pathlib import Path

from pal.client import Client
from tests.conftest import Backend
from tests.support.graphs import flaky
from tests.support.processes import Processes
from tests.support.tools import calls


def test_a_crash_between_attempts_keeps_the_count(processes: Processes, postgres_backend: Backend,
                                                  tmp_path: Path) -> None:
    counter = tmp_path / "calls.log"
    doomed = processes.worker("doomed", PAL_FAULT_POINT="after_retry_commit:f",
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    client = Client(postgres_backend.settings)
    run_id = client.start_run(flaky(counter, 2, {"maxAttempts": 3, "backoffMs": 10}), {})
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    # The kill came after attempt 1's step_retrying committed and before attempt 2 was published.
    assert [e.attempt for e in client.events(run_id) if e.kind == "step_retrying"] == [1]
    processes.worker("fresh")
    processes.beat()
    run = client.wait(run_id, timeout=120)
    assert run.status == "succeeded", run.error
    events = client.events(run_id)
    assert [e.attempt for e in events if e.kind == "step_started" and e.step_id == "f"] == [1, 2, 3]
    assert [e.attempt for e in events if e.kind == "step_retrying"] == [1, 2]
    assert [e.attempt for e in events if e.kind == "step_completed" and e.step_id == "f"] == [3]
    assert any(e.kind == "run_recovered" for e in events)
    assert calls(counter) == ["f", "f", "f"]
    client.close()
