"""A Postgres primary and its streaming standby of a test's own (initdb, pg_basebackup), on free
loopback ports, with synchronous replication as PAL's journal requires (docs/operations.md). The
servers run as the `postgres` user, as Postgres refuses root; both are stopped and removed at the end."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from tests.support.api_server import free_port

BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(*argv: str, timeout: float = 120) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True,
                   timeout=timeout)


class PostgresPair:
    def __init__(self) -> None:
        # Not under pytest's tmp_path: its folders are root's alone, and the servers run as postgres.
        self.folder = folder = Path(tempfile.mkdtemp(prefix="pal-pg-pair-"))
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        self.primary_dir, self.standby_dir = folder / "primary", folder / "standby"
        self.primary_port, self.standby_port = free_port(), free_port()
        self.running: list[Path] = []

    def url(self, database: str = "postgres") -> str:
        """A libpq multi-host URL that finds whichever of the two accepts writes."""
        return (f"postgresql://postgres@/{database}?host=127.0.0.1:{self.primary_port}"
                f"&host=127.0.0.1:{self.standby_port}&target_session_attrs=read-write&connect_timeout=2")

    def direct_url(self, port: int, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}"

    def start(self) -> None:
        """The primary, then the standby streaming from it; commits then wait for the standby."""
        _as_postgres(str(BIN / "initdb"), "-D", str(self.primary_dir), "-A", "trust", "-U", "postgres",
                     "--no-sync")
        with (self.primary_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {self.primary_port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.folder}'\nwal_level = replica\n"
                       "max_wal_senders = 4\nmax_connections = 60\nfsync = off\n")
        self._pg_ctl(self.primary_dir, "start")
        _as_postgres(str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary_port), "-U",
                     "postgres", "-D", str(self.standby_dir), "-R", "-X", "stream")
        with (self.standby_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {self.standby_port}\n")
        self._pg_ctl(self.standby_dir, "start")
        primary = sa.create_engine(self.direct_url(self.primary_port), isolation_level="AUTOCOMMIT")
        try:
            deadline = time.monotonic() + 60
            with primary.connect() as conn:
                while not conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")).scalar():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the standby did not start streaming")
                    time.sleep(0.2)
                conn.execute(sa.text("ALTER SYSTEM SET synchronous_standby_names = '*'"))
                conn.execute(sa.text("SELECT pg_reload_conf()"))
        finally:
            primary.dispose()

    def stop_primary(self) -> None:
        """The primary dies as a crashed host's would: no checkpoint, no goodbye to its clients."""
        self._pg_ctl(self.primary_dir, "stop", "-m", "immediate")
        self.running.remove(self.primary_dir)

    def promote_standby(self) -> None:
        _as_postgres(str(BIN / "pg_ctl"), "-D", str(self.standby_dir), "-w", "promote")

    def stop_all(self) -> None:
        for data in list(self.running):
            subprocess.run(["runuser", "-u", "postgres", "--", str(BIN / "pg_ctl"), "-D", str(data), "stop",
                            "-m", "immediate"], capture_output=True, timeout=60)
        self.running.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _pg_ctl(self, data: Path, action: str, *args: str) -> None:
        if action == "start":
            _as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "start")
            self.running.append(data)
        else:
            _as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-w", action, *args)
