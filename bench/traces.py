"""Traces on and off (docs/observability.md): PAL's throughput with tracing off, and with every
worker exporting its spans over OTLP/HTTP to a local collector stand-in, measured in turn in one run.

    .venv/bin/python -m bench.traces [--reps N] [--quick] [--json FILE]

The same scenarios as bench/throughput.py (one run of 300 steps; 20 runs of 100 at once), the same
fresh schema, prefix, queue and `pal worker` per measurement; off and on alternate within each
repetition, so a drift of the machine's speed hits both. Reports steps/s, on / off per repetition,
CPU per step, and the spans the collector received (every claimed step and each run's root).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.otlp_collector import OtlpCollector  # noqa: E402

from bench import cpu  # noqa: E402
from bench.throughput import (  # noqa: E402
    Infra,
    Measurement,
    Scenario,
    bench_arguments,
    cleanup_on_signals,
    measure_pal,
    median_rate,
)


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "smaller graphs", None, argv)
    scenarios = ([Scenario("linear", 1, 60), Scenario("concurrent", 5, 40)] if args.quick
                 else [Scenario("linear", 1, 300), Scenario("concurrent", 20, 100)])
    infra = Infra()
    infra.check()
    results: dict[str, dict[str, list[Measurement]]] = {s.name: {"off": [], "on": []} for s in scenarios}
    spans: dict[str, list[int]] = {s.name: [] for s in scenarios}
    began = time.monotonic()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-traces-") as folder, \
            OtlpCollector() as collector:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SERVICE_NAME": "pal-bench"}
        try:
            for rep in range(1, reps + 1):
                for s in scenarios:
                    for mode, extra in (("off", {}), ("on", otel)):
                        before = len(collector.received())
                        m = measure_pal(infra, s, Path(folder), extra_env=extra)
                        results[s.name][mode].append(m)
                        if mode == "on":
                            time.sleep(6)  # the batch processor's last export (every 5 s)
                            spans[s.name].append(len(collector.received()) - before)
                        print(f"rep {rep}/{reps} {s.name:<11} tracing {mode:<3} {m.steps:5d} steps "
                              f"{m.seconds:7.2f}s {m.rate:8.1f} steps/s", flush=True)
        finally:
            infra.close()
    print(f"\nworker concurrency 2 (prefork), reps {reps}, medians; total {time.monotonic() - began:.0f}s")
    table: list[dict[str, Any]] = []
    for s in scenarios:
        off, on = (results[s.name][k] for k in ("off", "on"))
        ratios = [b.rate / a.rate for a, b in zip(off, on, strict=True)]
        cpu_off, cpu_on = (sum(cpu.medians([m.cpu_ms for m in ms if m.cpu_ms]).values()) for ms in (off, on))
        row = {"scenario": f"{s.name} ({s.graphs}x{s.nodes})", "off": median_rate(off), "on": median_rate(on),
               "on_over_off": ratios, "cpu_ms_off": cpu_off, "cpu_ms_on": cpu_on, "spans": spans[s.name]}
        table.append(row)
        per_rep = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{row['scenario']:<22} off {row['off']:7.1f} steps/s  on {row['on']:7.1f} steps/s  "
              f"on/off per rep {per_rep} (median {statistics.median(ratios):.2f})  "
              f"CPU/step {cpu_off:.2f} -> {cpu_on:.2f} ms  spans received {spans[s.name]}")
    if args.json:
        args.json.write_text(json.dumps({"reps": reps, "table": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
