"""`pal runs events RUN --follow`: the journal live, from a separate process, until the run ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pal.client import Client
from tests.conftest import Backend
from tests.support.graphs import linear
from tests.support.workers import in_process_worker


def follow(backend: Backend, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pal.cli", "runs", "events", *args], env=backend.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_follow_prints_each_event_as_it_lands_until_the_run_ends(backend: Backend, client: Client,
                                                                 tmp_path: Path) -> None:
    run_id = client.start_run(linear(tmp_path / "c", 2), {})  # no worker yet: the follower waits
    follower = follow(backend, run_id, "--follow", "--json")
    with in_process_worker(client):
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds[0] == "run_queued" and kinds[-1] == "run_succeeded" and kinds.count("step_completed") == 4
    assert [e.kind for e in client.events(run_id)] == kinds  # every event, once, in order


def test_follow_exits_3_for_no_run_and_5_past_its_timeout(backend: Backend, client: Client,
                                                          tmp_path: Path) -> None:
    missing = follow(backend, "run_nope", "--follow")
    assert missing.wait(timeout=60) == 3 and "no run 'run_nope'" in (missing.stderr.read() if missing.stderr else "")
    run_id = client.start_run(linear(tmp_path / "c", 1), {})  # no worker: it never ends
    stuck = follow(backend, run_id, "--follow", "--timeout", "1")
    out, err = stuck.communicate(timeout=60)
    assert stuck.returncode == 5 and f"run {run_id} not finished after 1s" in err
    assert "run_queued" in out
