"""A PgBouncer of a test's own in transaction mode (Debian's `pgbouncer`), on a free loopback port in
front of the local Postgres, and a database of the test's own behind it: PgBouncer forwards no
`options` startup parameter, so the suite's schema-per-test URLs cannot pass through it."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from tests.support.api_server import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SERVER_CONNECTIONS = 10  # default_pool_size: what Postgres sees of every PAL process together


@contextmanager
def pgbouncer_database(admin: sa.Engine) -> Iterator[tuple[str, str]]:
    """(the URL through PgBouncer, the direct URL) of a fresh database; all removed at the end."""
    database = f"pal_pgb_{uuid.uuid4().hex[:12]}"
    folder = Path(tempfile.mkdtemp(prefix="pal-pgbouncer-"))
    user = pwd.getpwnam("postgres")
    os.chown(folder, user.pw_uid, user.pw_gid)
    port = free_port()
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host=127.0.0.1 port=5432 dbname={database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {SERVER_CONNECTIONS}\nmax_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\n")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    bouncer = subprocess.Popen([PGBOUNCER, "-u", "postgres", str(folder / "pgbouncer.ini")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        through = f"postgresql://postgres@127.0.0.1:{port}/{database}"
        _wait_for(through)
        yield through, f"postgresql://postgres@127.0.0.1:5432/{database}"
    finally:
        bouncer.kill()
        bouncer.wait(timeout=10)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(url: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        engine.dispose()
