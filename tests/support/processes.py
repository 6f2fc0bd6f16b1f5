"""Real `pal worker` and `pal beat` subprocesses for crash tests, killed at the end of a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pal.cli.demo import kill_process_group
from tests.conftest import Backend

LEASE_TTL = "2s"
SWEEP_EVERY = "1s"


class Processes:
    """Starts `pal worker` and `pal beat` subprocesses and stops whatever is left at the end."""

    def __init__(self, backend: Backend, folder: Path) -> None:
        self.backend, self.folder = backend, folder
        self.started: list[subprocess.Popen[bytes]] = []
        self.common: dict[str, str] = {}  # extra environment for every process (provider URLs, ...)

    def env(self, **extra: str) -> dict[str, str]:
        return (self.backend.env() | {"PAL_LEASE_TTL": LEASE_TTL, "PAL_RECOVERY_INTERVAL": SWEEP_EVERY}
                | self.common | extra)

    def start(self, args: list[str], log_name: str, **extra: str) -> subprocess.Popen[bytes]:
        with (self.folder / log_name).open("ab") as log:
            # A session of its own, so that the end of the test kills a prefork pool's children too.
            process = subprocess.Popen([sys.executable, "-m", "pal.cli", *args], env=self.env(**extra),
                                       stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                       start_new_session=True)
        self.started.append(process)
        return process

    def worker(self, name: str, *, concurrency: int = 0, **extra: str) -> subprocess.Popen[bytes]:
        """By default a solo pool: the worker process is the one that executes, so SIGKILL takes the
        whole worker. With `concurrency`, a prefork pool whose killed children Celery replaces."""
        pool = ["--pool", "prefork", "--concurrency", str(concurrency)] if concurrency else ["--pool", "solo"]
        return self.start(["worker", *pool, "--loglevel", "INFO"], f"{name}.log", **extra)

    def two_solo_workers_and_beat(self) -> None:
        """Two solo workers, each its own node name (w1.log, w2.log), and a beat."""
        self.worker("w1")
        self.start(["worker", "--pool", "solo", "--hostname", "w2@%h", "--loglevel", "INFO"], "w2.log")
        self.beat()

    def beat(self) -> subprocess.Popen[bytes]:
        return self.start(["beat", "--loglevel", "INFO"], "beat.log")

    def cli(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """Run one `pal` command against the same backend and wait for it."""
        return subprocess.run([sys.executable, "-m", "pal.cli", *args], env=self.env(**extra),
                              capture_output=True, text=True, timeout=120)

    def stop_all(self) -> None:
        # A test's teardown needs no graceful stop, so every process it started is SIGKILLed with
        # its children: Celery's warm shutdown takes over a second per worker, and the suite starts
        # hundreds. Each test's schema, key prefix and folder are its own, so nothing outlives it.
        for process in self.started:
            kill_process_group(process)
