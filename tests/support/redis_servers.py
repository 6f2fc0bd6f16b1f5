"""Real Redis servers of a test's own on free loopback ports: a TLS one, and a Sentinel set (a master,
its replica and one sentinel watching them). Stopped, with everything they wrote, at the end."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.support.api_server import free_port

MASTER_NAME = "palmaster"
SENTINEL_PASSWORD = "sentinel-test-password"


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]


class RedisServers:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.servers: list[Server] = []

    def start(self, name: str, *args: str, config: str = "", tls: bool = False) -> Server:
        """A redis-server (or, with `--sentinel` in `args`, a sentinel) that keeps nothing on disk."""
        port = free_port()
        conf = self.folder / f"{name}.conf"
        conf.write_text(config.format(port=port))  # a sentinel rewrites its file: it must be its own
        ports = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
        keeps_nothing = [] if "--sentinel" in args else ["--save", "", "--appendonly", "no"]
        with (self.folder / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                ["redis-server", str(conf), *ports, "--bind", "127.0.0.1", *keeps_nothing,
                 "--dir", str(self.folder), *args],
                stdout=log, stderr=subprocess.STDOUT)
        server = Server(port, process)
        self.servers.append(server)
        return server

    def sentinel_set(self) -> tuple[Server, Server, Server]:
        """A master, its replica (in sync before this returns) and a sentinel, behind a password,
        that fails over to the replica about a second after the master stops answering."""
        master = self.start("master")
        wait_for(lambda: client(master.port).ping())
        replica = self.start("replica", "--replicaof", "127.0.0.1", str(master.port))
        wait_for(lambda: client(replica.port).info("replication").get("master_link_status") == "up")
        sentinel = self.start("sentinel", "--sentinel", config=(
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
            f"requirepass {SENTINEL_PASSWORD}\n"))
        wait_for(lambda: sentinel_master(sentinel.port) == master.port)
        return master, replica, sentinel

    def tls_server(self, certs: Certificates) -> Server:
        server = self.start("tls", "--tls-cert-file", str(certs.server_cert), "--tls-key-file",
                            str(certs.server_key), "--tls-ca-cert-file", str(certs.ca),
                            "--tls-auth-clients", "no", tls=True)
        wait_for(lambda: redis.Redis(host="127.0.0.1", port=server.port, ssl=True, ssl_ca_certs=str(certs.ca),
                                     socket_timeout=2).ping())
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.process.kill()
            server.process.wait(timeout=10)


def client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)


def sentinel_master(sentinel_port: int) -> int | None:
    """The port of the master the sentinel names now."""
    try:
        address = redis.Redis(host="127.0.0.1", port=sentinel_port, password=SENTINEL_PASSWORD,
                              socket_timeout=2).execute_command("SENTINEL", "get-master-addr-by-name",
                                                                MASTER_NAME)
    except redis.RedisError:
        return None
    return int(address[1]) if address else None


def wait_for(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("a Redis server of the test did not come up")
        time.sleep(0.1)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path


def make_certificates(folder: Path) -> Certificates:
    """A CA of the test's own and a certificate it signed for 127.0.0.1 (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=pal-test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.cnf")
    return Certificates(folder / "ca.crt", folder / "server.crt", folder / "server.key")
