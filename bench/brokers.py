"""PAL's step throughput on the brokers teams run in production, against plain Redis in the same run:
Redis over TLS with PAL's fast paths (they speak TLS), the same with the two Redis fast paths off
(kombu's own transport and publisher), and Redis behind Sentinel (where PAL turns those two off).

    .venv/bin/python -m bench.brokers [--reps N] [--quick]

Each broker is a redis-server of this run's own on a free loopback port (tests/support/redis_servers.py):
a plain one, a TLS one with a CA of its own, and a master with its replica and a sentinel. Each
repetition measures every set-up once, in a rotated order, with two solo workers
(bench.throughput.measure_pal); each figure is steps/s over the plain Redis figure of the same
repetition. Loopback only; the servers, schemas and keys are removed at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.redis_servers import (
    MASTER_NAME,
    SENTINEL_PASSWORD,
    RedisServers,
    client,
    make_certificates,
    wait_for,
)

from bench.throughput import Infra, Scenario, bench_arguments, cleanup_on_signals, measure_pal
from pal.workers.celery_private import SWITCH

# The fast paths but the two that speak to Redis themselves (publisher, redis_transport).
WITHOUT_REDIS_PATHS = "inline,event_batches,atomic_files"


@contextmanager
def fast_paths(switch: str | None) -> Iterator[None]:
    """PAL_CELERY_FAST_PATHS for this process's client too (the workers get it in their env)."""
    before = os.environ.get(SWITCH)
    if switch is not None:
        os.environ[SWITCH] = switch
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before


def set_ups(servers: RedisServers, folder: Path) -> dict[str, dict[str, str]]:
    plain = servers.start("plain")
    wait_for(lambda: client(plain.port).ping())
    certs = make_certificates(folder / "certs")
    tls = servers.tls_server(certs)
    _, _, sentinel = servers.sentinel_set()
    rediss = {"PAL_BROKER_URL": f"rediss://127.0.0.1:{tls.port}/0", "PAL_BROKER_TLS_CA_FILE": str(certs.ca)}
    return {
        "redis": {"PAL_BROKER_URL": f"redis://127.0.0.1:{plain.port}/0"},
        "rediss": rediss,
        "rediss, public paths": rediss | {SWITCH: WITHOUT_REDIS_PATHS},
        "sentinel": {"PAL_BROKER_URL": f"sentinel://127.0.0.1:{sentinel.port}",
                     "PAL_BROKER_TRANSPORT_OPTIONS": json.dumps(
                         {"master_name": MASTER_NAME, "sentinel_kwargs": {"password": SENTINEL_PASSWORD}})},
    }


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "smaller graphs", None, argv)
    scenarios = ([Scenario("linear", 1, 40), Scenario("concurrent", 5, 20)] if args.quick
                 else [Scenario("linear", 1, 150), Scenario("concurrent", 10, 50)])
    infra = Infra()
    infra.check()
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pal-bench-brokers-") as tmp, cleanup_on_signals():
        servers = RedisServers(Path(tmp) / "redis")
        try:
            configs = set_ups(servers, Path(tmp))
            names = list(configs)
            for rep in range(reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for scenario in scenarios:
                    by_name: dict[str, float] = {}
                    for name in order:
                        env = configs[name]
                        with fast_paths(env.get(SWITCH)):
                            measured = measure_pal(infra, scenario, Path(tmp), solo=True, broker_env=env)
                        by_name[name] = measured.rate
                        print(f"rep {rep + 1}/{reps} {scenario.name:10} {name:22} "
                              f"{measured.rate:7.0f} steps/s", flush=True)
                    for name in names:
                        rates.setdefault((scenario.name, name), []).append(by_name[name] / by_name["redis"])
        finally:
            servers.stop_all()
            infra.close()
    print(f"\nsteps/s over plain Redis's in the same repetition (median of {reps}; two solo workers)")
    print("| broker | " + " | ".join(s.name for s in scenarios) + " |")
    print("|---|" + "---:|" * len(scenarios))
    for name in names:
        cells = [f"{statistics.median(rates[(s.name, name)]):.2f}" for s in scenarios]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({f"{s}/{n}": v for (s, n), v in rates.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
