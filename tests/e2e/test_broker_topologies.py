"""The brokers teams run in production: Redis behind Sentinel (its master failing over mid-run) and
Redis over TLS, each with real redis-server processes of the test's own on loopback ports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.clock import utcnow
from tests.conftest import Backend, migrated_postgres_backend
from tests.e2e.test_crash_recovery import assert_exactly_once, steps_completed
from tests.e2e.test_service_loss import napping_graph
from tests.support import web
from tests.support.processes import Processes
from tests.support.redis_servers import (
    MASTER_NAME,
    SENTINEL_PASSWORD,
    RedisServers,
    free_port,
    make_certificates,
    sentinel_master,
)


@pytest.fixture
def redis_servers(tmp_path: Path) -> Iterator[RedisServers]:
    servers = RedisServers(tmp_path / "redis")
    yield servers
    servers.stop_all()


def backend_on(folder: Path, pg_url: str, broker_url: str, **env: str) -> Backend:
    return migrated_postgres_backend(folder, pg_url, broker_url, "paltest:", **env)


def test_a_sentinel_failover_mid_run_and_every_run_finishes(
        redis_servers: RedisServers, pg_url: str, tmp_path: Path) -> None:
    master, replica, sentinel = redis_servers.sentinel_set()
    # Two sentinels named, the first of them not listening: PAL goes on to the next.
    sentinels = f"sentinel://127.0.0.1:{free_port()};sentinel://127.0.0.1:{sentinel.port}"
    options = {"master_name": MASTER_NAME, "sentinel_kwargs": {"password": SENTINEL_PASSWORD}}
    backend = backend_on(tmp_path, pg_url, sentinels, PAL_BROKER_TRANSPORT_OPTIONS=json.dumps(options))
    procs = Processes(backend, tmp_path)
    client = Client(backend.settings)
    try:
        procs.two_solo_workers_and_beat()
        run_ids = [client.start_run(napping_graph(0.3, 6), {"i": i}) for i in range(5)]
        assert wait_until(lambda: steps_completed(client, run_ids) >= 8, timeout=60)
        master.process.kill()  # the master is gone mid-run; the sentinel promotes the replica
        assert wait_until(lambda: sentinel_master(sentinel.port) == replica.port, timeout=30)
        runs = [client.wait(r, timeout=180) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 5
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
        banner = (tmp_path / "w1.log").read_text()
        # Both paths are off behind Sentinel; the banner names those the installed kombu had on.
        assert "off for a Sentinel broker" in banner and "redis_transport" in banner
        assert SENTINEL_PASSWORD not in banner
    finally:
        client.close()
        procs.stop_all()


def test_a_tls_broker_runs_steps_on_the_fast_path(
        redis_servers: RedisServers, pg_url: str, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    server = redis_servers.tls_server(certs)
    backend = backend_on(tmp_path, pg_url, f"rediss://127.0.0.1:{server.port}/0",
                         PAL_BROKER_TLS_CA_FILE=str(certs.ca))
    procs = Processes(backend, tmp_path)
    client = Client(backend.settings)
    try:
        assert client.runtime.publish is not None
        procs.worker("w1")
        procs.beat()
        run_ids = [client.start_run(napping_graph(0.05, 5), {"i": i}) for i in range(3)]
        runs = [client.wait(r, timeout=120) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 3
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
        banner = (tmp_path / "w1.log").read_text()
        assert "pal worker: queues" in banner and " off for " not in banner  # the fast path is on
    finally:
        client.close()
        procs.stop_all()


def test_a_tls_broker_whose_certificate_is_not_trusted_gets_no_run(
        redis_servers: RedisServers, pg_url: str, tmp_path: Path) -> None:
    """A CA that did not sign the broker's certificate: `pal run` fails saying so and that the run
    waits in the journal for the sweep, and nothing reaches the broker."""
    server = redis_servers.tls_server(make_certificates(tmp_path / "certs"))
    stranger = make_certificates(tmp_path / "stranger")
    backend = backend_on(tmp_path, pg_url, f"rediss://127.0.0.1:{server.port}/0",
                         PAL_BROKER_TLS_CA_FILE=str(stranger.ca))
    procs = Processes(backend, tmp_path)
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(napping_graph(0.01, 1)))
    done = procs.cli("run", str(graph), "--no-follow")
    assert done.returncode == 4, done.stderr  # the broker failed, as a journal that fails exits 4
    said = done.stderr.lower()
    assert "is journaled, but the broker did not take the doorbell" in said
    assert "certificate verify failed" in said and "traceback" not in said
    trusted = redis.Redis(host="127.0.0.1", port=server.port, ssl=True, ssl_ca_certs=str(tmp_path / "certs" / "ca.crt"))
    assert trusted.dbsize() == 0


def test_the_cli_the_api_and_flower_work_behind_sentinel(
        redis_servers: RedisServers, pg_url: str, tmp_path: Path) -> None:
    """`pal run` starts and follows a run, `pal api` starts one, and `pal flower` sees their tasks,
    on a Sentinel broker."""
    _, _, sentinel = redis_servers.sentinel_set()
    options = {"master_name": MASTER_NAME, "sentinel_kwargs": {"password": SENTINEL_PASSWORD}}
    backend = backend_on(tmp_path, pg_url, f"sentinel://127.0.0.1:{sentinel.port}",
                         PAL_BROKER_TRANSPORT_OPTIONS=json.dumps(options))
    procs = Processes(backend, tmp_path)
    port = free_port()
    try:
        procs.worker("w1")
        procs.start(["flower", "--port", str(port)], "flower.log", PAL_FLOWER_BASIC_AUTH="admin:s3cret")

        def flower_tasks() -> dict[str, dict[str, object]]:
            try:
                reply = web.get(f"http://127.0.0.1:{port}/api/tasks", auth=("admin", "s3cret"), timeout=10)
            except httpx.TransportError:
                return {}
            return reply.json() if reply.status_code == 200 else {}

        graph = tmp_path / "graph.json"
        graph.write_text(json.dumps(napping_graph(0.01, 2)))

        def run_seen_by_flower() -> bool:  # task events reach Flower once its receiver subscribed
            done = procs.cli("run", str(graph), "--timeout", "60")
            assert done.returncode == 0, done.stderr
            return wait_until(lambda: any(t.get("name") == "pal.execute_node"
                                          for t in flower_tasks().values()), 2)

        assert wait_until(run_seen_by_flower, timeout=90), (tmp_path / "flower.log").read_text()[-2000:]

        client = Client(backend.settings)
        _, token = client.runtime.journal.tokens.create_token(tenant_id="acme", name="test", now=utcnow())
        client.close()
        api_port = free_port()
        procs.start(["api", "--port", str(api_port)], "api.log")
        api = f"http://127.0.0.1:{api_port}"
        assert wait_until(lambda: _answers(api + "/openapi.json"), timeout=60), (tmp_path / "api.log").read_text()
        auth = {"Authorization": f"Bearer {token}"}
        started = web.request("POST", api + "/v1/runs", headers=auth, timeout=30,
                              json={"graph": napping_graph(0.01, 2), "input": {}})
        assert started.status_code == 201, started.text
        run_url = f"{api}/v1/runs/{started.json()['id']}"
        assert wait_until(lambda: web.get(run_url, headers=auth, timeout=10).json()["status"] == "succeeded",
                          timeout=60)
    finally:
        procs.stop_all()


def _answers(url: str) -> bool:
    try:
        return web.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
