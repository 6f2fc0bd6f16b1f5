"""A team's own Celery app hosts PAL (`pal.install`): README's "Add PAL to an existing Celery
project" example, run as written, in a real `celery -A team_app worker` (solo and prefork) that
runs the team's task and PAL's steps; the app's own settings stay as the team set them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import migrated_postgres_backend
from tests.support.graphs import linear
from tests.support.processes import Processes
from tests.support.tools import calls

README = Path(__file__).resolve().parents[2] / "README.md"
TEAM_BROKER = "redis://127.0.0.1:6379/12"  # this test's own Redis db: the README's app has no key prefix


def readme_example() -> str:
    section = README.read_text().split("## Add PAL to an existing Celery project", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "README's section has no Python example"
    return found.group(1)


@pytest.fixture
def team(tmp_path: Path, pg_url: str) -> Iterator[Processes]:
    flush = redis.Redis.from_url(TEAM_BROKER)
    flush.flushdb()
    backend = migrated_postgres_backend(tmp_path, pg_url, TEAM_BROKER, "")
    procs = Processes(backend, tmp_path)
    (tmp_path / "team_app.py").write_text(readme_example())
    yield procs
    procs.stop_all()
    flush.flushdb()
    flush.close()


def team_env(procs: Processes) -> dict[str, str]:
    env = procs.env()
    return env | {"PYTHONPATH": os.pathsep.join((str(procs.folder), env["PYTHONPATH"]))}


def celery(procs: Processes, args: list[str], log: str) -> subprocess.Popen[bytes]:
    env = team_env(procs)
    with (procs.folder / log).open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "team_app", *args], env=env,
                                   stdout=out, stderr=subprocess.STDOUT, cwd=procs.folder,
                                   start_new_session=True)
    procs.started.append(process)
    return process


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_teams_celery_app_runs_its_own_task_and_pals_steps(team: Processes, tmp_path: Path,
                                                             pool: str) -> None:
    queue = team.backend.settings.queue
    celery(team, ["worker", "-Q", f"celery,{queue}", "--pool", pool, "--concurrency", "2",
                  "--loglevel", "INFO", "--without-mingle", "--without-gossip"], "team.log")
    settings = subprocess.run(
        [sys.executable, "-c", "import json, team_app as t; c = t.app.conf; x = t.app.tasks['pal.execute_node']; "
         "print(json.dumps([c.task_default_queue, c.worker_prefetch_multiplier, c.task_acks_late, "
         "sorted(c.beat_schedule), x.acks_late, x.reject_on_worker_lost, sorted(t.app.tasks)]))"],
        env=team_env(team), capture_output=True, text=True, timeout=60, check=True)
    default_queue, prefetch, acks_late, beat, pal_acks_late, pal_reject, tasks = json.loads(
        settings.stdout.strip().splitlines()[-1])
    # The team's settings are Celery's defaults still; PAL's tasks carry their own.
    assert (default_queue, prefetch, acks_late) == ("celery", 4, False)
    assert beat == ["pal-fire-schedules", "pal-recompute-baselines", "pal-sweep-orphans"]
    assert (pal_acks_late, pal_reject) == (True, True)
    assert {"team_app.greet", "pal.execute_node", "pal.start_run", "pal.sweep_orphans"} <= set(tasks)

    client = Client(team.backend.settings)
    try:
        ledgers = [tmp_path / f"calls-{n}.log" for n in range(4)]
        run_ids = [client.start_run(linear(ledger, 3), {}) for ledger in ledgers]
        sender = Celery("sender", broker=TEAM_BROKER, set_as_current=False)  # as any other service
        sender.send_task("team_app.greet", args=["ada"], queue="celery")
        for run_id in run_ids:
            assert client.wait(run_id, timeout=120).status == "succeeded"
            completed = Counter(e.step_id for e in client.events(run_id) if e.kind == "step_completed")
            assert set(completed.values()) == {1}, completed
        assert all(sorted(calls(ledger)) == ["s0", "s1", "s2"] for ledger in ledgers)
        assert wait_until(lambda: "hello ada" in (tmp_path / "team.log").read_text(), timeout=30)
    finally:
        client.close()

