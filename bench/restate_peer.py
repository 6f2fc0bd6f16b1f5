"""Restate (its server from the npm registry, its Python SDK from PyPI) as a peer of PAL: durable
no-op steps per second.

    .venv/bin/python bench/restate_peer.py [--reps N] [--quick] [--json PATH]

Scenarios (the same shapes as bench/throughput.py and bench/dbos_peer.py):
  linear       one invocation of a handler running N sequential `ctx.run_typed` no-op steps (N = 300)
  concurrent   K such invocations of M steps, sent at once (default 20 x 100)
steps/s = completed steps / wall time. The clock (time.perf_counter) starts just before the first
request to the ingress and stops when the last invocation's response is back in this process; each
response is checked to be the number of steps that invocation ran.

How it runs. `restate-server` (the pinned SERVER_VERSION, installed by this script with npm into
.venv/restate-server, or ~/.cache/palbench/ without a .venv) keeps each invocation's journal in its
own execution log (default configuration, fsync on): the SDK proposes a `ctx.run` result to the
server and the handler goes on with the value the server sends back once it has stored it, so a
step is on record before the next one starts. The service is
this module served by hypercorn in a second process (`--serve`, HTTP/2 without TLS, the protocol
the server speaks to a deployment); it is registered through the admin API (:9070), and the driver
invokes it through the ingress (:8080) with httpx, all concurrent requests on one asyncio loop.
The server checks for updates at start, so everything runs in a network namespace that has only
loopback: this script re-executes itself under `unshare --net` (root only), brings `lo` up, and
the server, the service and the driver talk to 127.0.0.1 only. Each process run gets a fresh
server data directory, deleted at the end; the server and the service are stopped on the way out,
also on failure. One untimed round of each scenario's shape warms everything up first.

CPU per step is the user + system time of the server, the service and the driver over a
measurement, divided by its steps (bench/cpu.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    # Run as a script or as `python -m bench.restate_peer`: the same module path either way.
    sys.path.insert(0, str(REPO))

from bench import cpu  # noqa: E402
from bench.peers import (  # noqa: E402
    Samples,
    Scenario,
    finish,
    log,
    scenarios,
    warm_ups,
    write_failure,
)
from bench.throughput import bench_arguments, cleanup_on_signals, log_tail, stop_process  # noqa: E402

SERVER_PACKAGE = "@restatedev/restate-server"
SERVER_VERSION = "1.7.12"  # issue 24 measured Restate 1.7
NETNS_MARK = "PALBENCH_RESTATE_NETNS"  # set in the re-executed process, inside the namespace
INGRESS = "http://127.0.0.1:8080"
ADMIN = "http://127.0.0.1:9070"
SERVICE_PORT = 9080
SERVICE = "PalbenchChain"
READY_TIMEOUT = 60.0  # seconds the server or the service may take to come up
WAIT_TIMEOUT = 300.0  # seconds one scenario's invocations may take before the measurement is abandoned


# ------------------------------------------------------------------------------- the service


async def noop_step(index: int) -> int:
    """Does nothing; the small return value is what Restate journals. A coroutine, since the SDK
    runs a plain function's action on a thread pool."""
    return index


def serve(port: int) -> None:
    """Serve the chain handler with hypercorn on 127.0.0.1:`port` until SIGTERM."""
    import restate
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config
    from restate.server import install_shutdown_hook

    chain = restate.Service(SERVICE)

    # `ctx: Any`: the SDK evaluates the annotations in this module's globals, where `restate` is not
    # (it is imported here, so that the driver runs, and fails clearly, without the SDK).
    @chain.handler("run")
    async def run(ctx: Any, steps: int) -> int:
        """`steps` no-op steps, one after the other, each journaled; returns how many ran."""
        done = 0
        for index in range(steps):
            if await ctx.run_typed("noop", noop_step, restate.RunOptions(), index) == index:
                done += 1
        return done

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    # The server keeps one HTTP/2 connection open and multiplexes every invocation over it.
    config.h2_max_concurrent_streams = 1 << 20
    config.keep_alive_timeout = 3600
    config.graceful_timeout = 1  # the server's connection stays open; do not wait for it at exit
    stop = asyncio.Event()

    async def main() -> None:
        # Through the SDK's own SIGTERM hook: the app installs it at its first request, and a plain
        # loop.add_signal_handler here would be replaced by it.
        install_shutdown_hook(asyncio.get_running_loop(), stop.set)
        await hypercorn_serve(restate.app(services=[chain]), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    asyncio.run(main())


# ------------------------------------------------------------------------- server installation


def install_folder() -> Path:
    venv = REPO / ".venv"
    if venv.is_dir():
        return venv / "restate-server"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "palbench" / "restate-server"


def server_binary() -> Path:
    """The pinned restate-server binary, installed from the npm registry when it is not there yet.
    The npm package ships the binary in a per-platform optional dependency; no install script
    needs to run (--ignore-scripts)."""
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine())
    if arch is None or sys.platform != "linux":
        raise RuntimeError(f"no restate-server package for {sys.platform}/{platform.machine()}")
    folder = install_folder()
    package = folder / "node_modules" / "@restatedev" / f"restate-server-linux-{arch}"
    binary = package / "bin" / "restate-server"
    try:
        installed = json.loads((package / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        installed = None
    if installed != SERVER_VERSION or not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed: it fetches restate-server from the npm registry")
        folder.mkdir(parents=True, exist_ok=True)
        log(f"installing {SERVER_PACKAGE}@{SERVER_VERSION} into {folder}")
        subprocess.run([npm, "install", "--prefix", str(folder), "--no-save", "--ignore-scripts",
                        "--no-audit", "--no-fund", "--loglevel", "error",
                        f"{SERVER_PACKAGE}@{SERVER_VERSION}"], check=True, timeout=600)
    if not binary.exists():
        raise RuntimeError(f"npm did not install {binary}")
    return binary


def reexec_in_netns(argv: list[str], module: str = "bench.restate_peer") -> int:
    """Run `module` (this script, by default) again in a new network namespace that has only
    loopback (`unshare --net`)."""
    if os.geteuid() != 0:
        raise RuntimeError("the Restate peer runs in a network namespace of its own: `unshare --net` "
                           "needs root")
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("unshare (util-linux) is not installed")
    command = [unshare, "--net", "--", sys.executable, "-m", module, *argv]
    child = subprocess.Popen(command, cwd=REPO, env={**os.environ, NETNS_MARK: "1"})
    try:
        return child.wait()
    finally:
        if child.poll() is None:  # we were interrupted: let the child clean up its own processes
            child.send_signal(signal.SIGTERM)
            child.wait(60)


# ---------------------------------------------------------------------- processes in the namespace


def bring_up_loopback() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    links = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip() for line in links.splitlines() if line.strip()]
    if names != ["lo"]:
        raise RuntimeError(f"the network namespace has more than loopback: {names}")


def wait_until(ready: Any, what: str, process: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log_tail(log_file)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {READY_TIMEOUT:g}s:\n{log_tail(log_file)}")
        time.sleep(0.1)


def http_ok(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start(argv: list[str], log_file: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log_file.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                start_new_session=True)


@contextlib.contextmanager
def running_restate(binary: Path, service: list[str] | None = None) -> Iterator[list[int]]:
    """The server on a fresh data directory and the service (`service`: its module and arguments,
    serving on SERVICE_PORT; by default this script's chain) registered with it; yields both pids.
    Both processes are stopped and the data directory deleted on the way out."""
    data = Path(tempfile.mkdtemp(prefix="palbench-restate-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        env = {**os.environ, "RESTATE_LOG_FILTER": "warn", "RESTATE_DISABLE_TELEMETRY": "true"}
        server_log = data / "server.log"
        processes.append(start([str(binary), "--base-dir", str(data / "node"), "--node-name", "palbench",
                                "--no-logo"], server_log, env))
        log(f"restate-server {SERVER_VERSION} pid {processes[0].pid}, data in {data}")
        service_log = data / "service.log"
        serving = service or ["bench.restate_peer", "--serve", str(SERVICE_PORT)]
        processes.append(start([sys.executable, "-m", *serving], service_log))
        wait_until(lambda: http_ok(f"{ADMIN}/health") and http_ok(f"{INGRESS}/restate/health"),
                   "restate-server", processes[0], server_log)
        wait_until(lambda: port_open(SERVICE_PORT), "the Restate service", processes[1], service_log)
        register()
        yield [process.pid for process in processes]
    finally:
        for process in reversed(processes):
            stop_process(process)
        shutil.rmtree(data, ignore_errors=True)
        log(f"stopped restate-server and the service, deleted {data}")


def register() -> None:
    """Register the service's deployment with the server (admin API); it then discovers the handler."""
    import httpx
    response = httpx.post(f"{ADMIN}/deployments", json={"uri": f"http://127.0.0.1:{SERVICE_PORT}"},
                          timeout=30)
    if not response.is_success:
        raise RuntimeError(f"registering the service failed: {response.status_code} {response.text}")


# ------------------------------------------------------------------------------ measurement


async def invoke_all(scenario: Scenario, timeout: float) -> tuple[list[int], float, float]:
    """Send the scenario's invocations at once; their results, and the clock at start and end."""
    import httpx
    limits = httpx.Limits(max_connections=scenario.workflows + 1)
    async with httpx.AsyncClient(base_url=INGRESS, timeout=timeout, limits=limits) as client:
        async def one() -> int:
            response = await client.post(f"/{SERVICE}/run", json=scenario.steps)
            response.raise_for_status()
            return int(response.json())

        t0 = time.perf_counter()
        calls = asyncio.gather(*(one() for _ in range(scenario.workflows)))
        results = await asyncio.wait_for(calls, timeout)
        return list(results), t0, time.perf_counter()


def run_scenario(scenario: Scenario, pids: list[int], timeout: float = WAIT_TIMEOUT) -> tuple[float, float]:
    """Run `scenario` once; its steps per second and CPU milliseconds per step (all processes)."""
    measured = [*pids, os.getpid()]
    before = cpu.seconds(measured)
    results, t0, t1 = asyncio.run(invoke_all(scenario, timeout))
    spent = cpu.seconds(measured) - before
    if results != [scenario.steps] * scenario.workflows:
        raise RuntimeError(f"{scenario.name}: invocations returned {results}, expected {scenario.steps} each")
    return scenario.total / (t1 - t0), 1000 * spent / scenario.total


def warm_up(plan: list[Scenario], pids: list[int]) -> None:
    """One untimed round of each shape; the first waits until the server knows the new deployment."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            run_scenario(Scenario("warm-up", 1, 1), pids, timeout=30)
            break
        except Exception as exc:  # e.g. 404 while the ingress has not seen the deployment yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"the registered service never answered: {exc!r}") from exc
            time.sleep(0.2)
    for scenario in warm_ups(plan):
        run_scenario(scenario, pids)


def measure(reps: int, quick: bool, binary: Path) -> dict[str, Any]:
    """Measure both scenarios `reps` times on a fresh server (inside the namespace).

    Returns {"restate_version", "restate_sdk_version", "linear": {...}, "concurrent": {...}}; each
    scenario has "workflows" (invocations), "steps" (all invocations' steps in one repetition),
    "steps_per_s" and "cpu_ms_per_step" (one figure per repetition) and their medians.
    """
    plan = scenarios(quick)
    samples = Samples(plan, reps)
    with running_restate(binary) as pids:
        warm_up(plan, pids)
        for rep in range(1, reps + 1):
            for scenario in plan:
                rate, cpu_ms = run_scenario(scenario, pids)
                samples.add(rep, scenario, rate, cpu_ms)
    return samples.result({"restate_version": SERVER_VERSION,
                           "restate_sdk_version": importlib.metadata.version("restate-sdk")})


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, reps = bench_arguments(__doc__, "small invocations", lambda parser: parser.add_argument(
        "--serve", type=int, default=None, metavar="PORT", help="(internal) serve the handler"), argv)
    if args.serve is not None:
        serve(args.serve)
        return 0
    # SIGTERM becomes KeyboardInterrupt on both sides of the namespace: outside, so that the child
    # is told to stop too; inside, so that its `finally` blocks stop the server and the service.
    try:
        with cleanup_on_signals():
            if not os.environ.get(NETNS_MARK):
                # Outside the namespace: install the server (it needs the registry), then go in.
                server_binary()
                return reexec_in_netns(argv)
            bring_up_loopback()
            result = measure(reps, args.quick, server_binary())
    except Exception as exc:  # bench/all.py shows why in its table; the peers around it still run
        write_failure(args.json, exc, "Restate")
        return 1
    finish(result, f"Restate {result['restate_version']} (Python SDK {result['restate_sdk_version']}), "
           f"loopback only, reps {reps}, medians", "Restate", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
