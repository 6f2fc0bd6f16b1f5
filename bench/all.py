"""`make bench`: every PAL benchmark and its peers in one run, then the results table in
docs/benchmarks.md (between the `make bench` markers).

    .venv/bin/python bench/all.py [--reps N] [--quick] [--no-write]

Runs, one after the other on the local Postgres and Redis (127.0.0.1 only), each in its own process:
  bench/throughput.py  PAL against raw Celery and the two-commits-per-hop floor (linear, concurrent)
  bench/dbos_peer.py   DBOS on the same Postgres (the same two scenarios)
  bench/langgraph_peer.py  LangGraph with its Postgres checkpointer (durability sync), same Postgres
  bench/restate_peer.py    Restate's server and Python SDK, in a loopback-only network namespace
                       one repetition of each of these four in turn, --reps times, so that both
                       sides of every PAL / peer ratio share the machine's drifts; a peer that
                       cannot be installed or fails shows as n/a, with why, and the others still run
  bench/scale.py       sweep pass at 1,000,000 finished runs, replay of 10,000 steps, worker memory
  bench/recovery.py    recovery latency after SIGKILL
  bench/sse.py         SSE latency against clients polling the journal
  bench/traces.py      PAL with tracing off and exporting OTLP to a local collector, in turn
  bench/handoff.py     hand-off latency p50/p99 (linear, concurrent) and a 200-branch fan-out
  bench/fairness.py    another tenant's first-step wait behind one tenant's 10,000 runs, admission off/on
  bench/agents_compare.py  agent-shaped load: 1,000 runs of 3 model calls (a stand-in answering
                       after 1 s) on PAL's set-ups and LangGraph in turn, then 10,000 runs at once
Ratios are PAL / peer, both measured in this run; medians over --reps repetitions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import agents_compare, cpu  # noqa: E402

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- make bench: begin -->", "<!-- make bench: end -->"
STEP_TIMEOUT_S = 3600  # one benchmark script may take this long before the run is abandoned


def run_script(name: str, args: list[str], folder: Path) -> dict[str, Any] | None:
    """Run `python -m bench.<name>` with --json; its result, or None (and why, on stderr) when it failed."""
    out = folder / f"{name}.json"
    command = [sys.executable, "-m", f"bench.{name}", *args, "--json", str(out)]
    print(f"== {name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    began = time.monotonic()
    # This tree's PAL, not whichever one the virtualenv's editable install points at (a worktree
    # benchmarked with main's .venv would otherwise drive the workers' code with main's client).
    path = os.pathsep.join(p for p in (str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(command, cwd=REPO, timeout=STEP_TIMEOUT_S, env=os.environ | {"PYTHONPATH": path})
    print(f"== {name}: exit {result.returncode} after {time.monotonic() - began:.0f}s", file=sys.stderr)
    if not out.exists():
        return None
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def _num(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "n/a"


def _scenario(throughput: dict[str, Any] | None, prefix: str) -> dict[str, Any]:
    for row in (throughput or {}).get("table", []):
        if row["scenario"].startswith(prefix):
            return dict(row)
    return {}


def _target(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**missed**")


PEERS = {"dbos_peer": "DBOS", "langgraph_peer": "LangGraph", "restate_peer": "Restate"}
# PAL / peer targets per scenario: DBOS's from issue 8 (with >= 0.9x the floor), Restate's from issue 24.
WANT_DBOS = {"linear": 1.0, "concurrent": 1.2}
WANT_RESTATE = {"linear": 0.9, "concurrent": 0.5}
WANT_CPU_MS = 1.5  # issue 24: PAL's CPU per step, all processes

HEADER = ("| scenario | PAL | raw Celery | floor (2 commits/hop) | 2 rows in 1 commit | DBOS | LangGraph "
          "| Restate | PAL / floor | PAL / DBOS | PAL / LangGraph | PAL / Restate "
          "| target (issue 8) | target (issue 24) |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")


def _peer(peers: dict[str, dict[str, Any] | None], name: str, key: str) -> dict[str, Any]:
    """One scenario of one peer's merged result ({} when the peer failed)."""
    return dict((peers.get(name) or {}).get(key) or {})


# PAL's two measured set-ups (bench/throughput.py): `pal worker`'s default, and solo workers.
PAL_SETUPS = {"pal": "prefork, 2 processes", "pal_solo": "2 solo workers"}


def throughput_rows(throughput: dict[str, Any] | None, peers: dict[str, dict[str, Any] | None]) -> list[str]:
    rows = []
    for key, setup in ((key, setup) for key in ("linear", "concurrent") for setup in PAL_SETUPS):
        row = _scenario(throughput, key)
        pal, floor = row.get(setup), row.get("floor")
        dbos, langgraph, restate = (_peer(peers, name, key).get("median") for name in PEERS)
        met = None if not (pal and floor and dbos) else (pal / floor >= 0.9 and pal / dbos >= WANT_DBOS[key])
        met_restate = None if not (pal and restate) else pal / restate >= WANT_RESTATE[key]
        rows.append(f"| {row.get('scenario', key)}, PAL {PAL_SETUPS[setup]} | {_num(pal)} "
                    f"| {_num(row.get('raw'))} | {_num(floor)} "
                    f"| {_num(row.get('floor1'))} | {_num(dbos)} | {_num(langgraph)} | {_num(restate)} "
                    f"| {_ratio(pal, floor)} | {_ratio(pal, dbos)} | {_ratio(pal, langgraph)} "
                    f"| {_ratio(pal, restate)} "
                    f"| >= 0.9x floor, >= {WANT_DBOS[key]}x DBOS: {_target(met)} "
                    f"| >= {WANT_RESTATE[key]}x Restate: {_target(met_restate)} |")
    return rows


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "/")


def peer_failures(peers: dict[str, dict[str, Any] | None]) -> list[str]:
    """Why a peer's columns say n/a: its own words (bench/peers.py, write_failure), or no result."""
    lines = []
    for name, label in PEERS.items():
        result = peers.get(name)
        if result is None:
            lines.append(f"- {label}: n/a, bench/{name}.py produced no result (see the run's output)")
        elif "error" in result:
            lines.append(f"- {label}: n/a, {_one_line(result['error'])}")
        if result and result.get("failed_reps"):
            lines.append(f"- {label}: {result['failed_reps']} repetition(s) failed: "
                         f"{_one_line(result['last_error'])}")
    return ["Peers without figures in this run:", "", *lines, ""] if lines else []


def cpu_total_rows(throughput: dict[str, Any] | None, peers: dict[str, dict[str, Any] | None]) -> list[str]:
    """CPU per step over all of each side's processes (medians), against issue 24's bound for PAL."""
    rows = [f"| CPU ms per step, all processes (medians) | PAL | {' | '.join(PEERS.values())} | target |",
            "|---|---:|---:|---:|---:|---|"]
    for key, setup in ((key, setup) for key in ("linear", "concurrent") for setup in PAL_SETUPS):
        row = _scenario(throughput, key)
        spent = (row.get("cpu_samples") or {}).get(setup) or []
        pal = sum(cpu.medians(spent).values()) if spent else None
        peer_ms = " | ".join(_num(_peer(peers, name, key).get("cpu_ms_median"), ".2f") for name in PEERS)
        met = None if pal is None else pal <= WANT_CPU_MS
        rows.append(f"| {row.get('scenario', key)}, PAL {PAL_SETUPS[setup]} | {_num(pal, '.2f')} | {peer_ms} "
                    f"| PAL <= {WANT_CPU_MS} ms: {_target(met)} |")
    return rows


def cpu_rows(throughput: dict[str, Any] | None) -> list[str]:
    """Where a step's CPU goes (bench/cpu.py), PAL against the floor; paired per-rep ratios."""
    rows = ["| CPU ms per step (medians) | driver | worker main | pool | Postgres | Redis | total |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for row in (throughput or {}).get("table", []):
        for kind in (*PAL_SETUPS, "floor"):
            spent = row.get("cpu_samples", {}).get(kind) or []
            if not spent:
                continue
            medians = list(cpu.medians(spent).values())
            who = f"PAL {PAL_SETUPS[kind]}" if kind in PAL_SETUPS else "floor"
            rows.append(f"| {row['scenario']}, {who} | "
                        + " | ".join(f"{m:.2f}" for m in medians)
                        + f" | {sum(medians):.2f} |")
    return rows if len(rows) > 2 else []


def paired_lines(throughput: dict[str, Any] | None, peers: dict[str, dict[str, Any] | None]) -> list[str]:
    """PAL / peer for each repetition (the two measured minutes apart at most), and their median:
    a drift of the machine's speed between repetitions cancels out of these. A peer's failed
    repetition is None in its list and pairs with nothing."""
    lines = []
    for key in ("linear", "concurrent"):
        samples = _scenario(throughput, key).get("samples", {})
        for setup, setup_label in PAL_SETUPS.items():
            lines += _paired(key, f"PAL {setup_label}", samples.get(setup, []), samples, peers)
    return ["Paired, each repetition against its own peer run:", "", *lines] if lines else []


def _paired(key: str, pal_label: str, pal: list[float], samples: dict[str, Any],
            peers: dict[str, dict[str, Any] | None]) -> list[str]:
    lines = []
    for label, peer in (("floor", samples.get("floor", [])),
                        *((label, _peer(peers, name, key).get("steps_per_s", []))
                          for name, label in PEERS.items())):
        ratios = [p / q for p, q in zip(pal, peer, strict=False) if q]
        if ratios:
            lines.append(f"- {key}, {pal_label} / {label} per rep: "
                         + " ".join(f"{r:.2f}" for r in ratios)
                         + f" (median {statistics.median(ratios):.2f}x)")
    return lines


def _below(value: Any, bound: float) -> str:
    return _target(None if not isinstance(value, int | float) else value < bound)


def measure_rows(scale: dict[str, Any], recovery: dict[str, Any], sse: dict[str, Any]) -> list[str]:
    sweep, replay, rss = (scale.get(k) for k in ("sweep_pass_ms", "replay_redrive_ms", "worker_rss_mb"))
    finished, in_flight = _num(scale.get("finished_runs"), ","), _num(scale.get("in_flight_runs"), ",")
    sizes = f"{finished} finished + {in_flight} in flight"
    p95, bound = _num(recovery.get("p95_s"), ".2f"), _num(recovery.get("bound_s"), ".1f")
    sse_ms, poll_ms = sse.get("sse_p50_ms"), sse.get("poll_p50_ms")
    return ["| measure | value | target |", "|---|---:|---|",
            f"| sweep pass, {sizes}, re-driving {_num(scale.get('orphans'), ',')} orphans | {_num(sweep)} ms "
            f"| < 50 ms: {_below(sweep, 50)} |",
            f"| the same pass with no orphan to re-drive | {_num(scale.get('sweep_idle_pass_ms'))} ms "
            f"| < 50 ms: {_below(scale.get('sweep_idle_pass_ms'), 50)} |",
            f"| orphan query alone | {_num(scale.get('sweep_query_ms'))} ms | |",
            f"| the hot path: a 300-node linear run beside those runs' "
            f"{_num(scale.get('journal_events'), ',')} journal events "
            f"| {_num(scale.get('hot_path_big_steps_per_s'))} steps/s, "
            f"{_num(scale.get('hot_path_big_over_empty'), '.2f')}x an empty schema's (paired) | flat |",
            f"| replay (re-drive) of a {_num(scale.get('replay_steps'), ',')}-step run | {_num(replay)} ms "
            f"| < 1000 ms: {_below(replay, 1000)} |",
            f"| next step after that replay | {_num(scale.get('replay_next_step_ms'))} ms | |",
            f"| worker RSS after a 300-node run | {_num(rss)} MB | < 150 MB: {_below(rss, 150)} |",
            f"| recovery after SIGKILL, p95 of {recovery.get('kills', 'n/a')} kills | {p95} s "
            f"| <= lease + interval + 2 s = {bound} s |",
            f"| SSE p50, {sse.get('subscribers', 'n/a')} subscribers | {_num(sse_ms)} ms "
            f"| {_ratio(sse_ms, poll_ms)} of polling's {_num(poll_ms)} ms |"]


def trace_lines(traces: dict[str, Any] | None) -> list[str]:
    """Tracing on against off, each repetition paired (docs/observability.md)."""
    lines = [f"- {row['scenario']}: {_num(row['off'])} steps/s off, {_num(row['on'])} on; on / off per rep "
             + " ".join(f"{r:.2f}" for r in row["on_over_off"])
             + f" (median {statistics.median(row['on_over_off']):.2f}x); CPU per step "
             f"{_num(row['cpu_ms_off'], '.2f')} -> {_num(row['cpu_ms_on'], '.2f')} ms"
             for row in (traces or {}).get("table", [])]
    return ["Traces, off and exporting OTLP/HTTP to a local collector (bench/traces.py):", "", *lines] \
        if lines else []


def handoff_lines(handoff: dict[str, Any] | None) -> list[str]:
    """Hand-off latency (a step_completed to its successor's step_started) and the fan-out."""
    rows = [f"| {row['scenario']} | {_num(row['steps_per_s'])} | {_num(row['p50_ms'], '.2f')} "
            f"| {_num(row['p99_ms'], '.2f')} |" for row in (handoff or {}).get("table", [])]
    return ["Hand-off, from a step's `step_completed` to its successor's `step_started` (bench/handoff.py):",
            "", "| scenario | steps/s | hand-off p50 ms | p99 ms |", "|---|---:|---:|---:|", *rows] \
        if rows else []


def fairness_lines(fairness: dict[str, Any] | None) -> list[str]:
    """Another tenant's first-step wait behind one tenant's flood, admission off and on."""
    if not fairness:
        return []
    off, on = fairness["off"], fairness["on"]
    rows = [f"| {label} | {_num(row['wait_p50_ms'])} | {_num(row['wait_p99_ms'])} |"
            for label, row in (("off", off), (f"PAL_TENANT_CONCURRENCY={on['limit']}", on))]
    return [f"Fairness: another tenant's run, from its start to its first step, while one tenant's "
            f"{off['flood']} runs drain (bench/fairness.py; p99 on/off {fairness['p99_on_over_off']}):", "",
            "| admission | wait p50 ms | p99 ms |", "|---|---:|---:|", *rows]


def report(results: dict[str, dict[str, Any] | None], reps: int, quick: bool) -> str:
    """The markdown block written into docs/benchmarks.md."""
    sized = " (--quick sizes)" if quick else ""
    peers = {name: results.get(name) for name in PEERS}
    lines = [f"Generated by `make bench` on {datetime.date.today().isoformat()}, {reps} rep(s){sized}; "
             "steps/s are medians, ratios PAL / peer in the same run.", "", HEADER,
             *throughput_rows(results.get("throughput"), peers), "",
             *peer_failures(peers),
             *paired_lines(results.get("throughput"), peers), "",
             *cpu_total_rows(results.get("throughput"), peers), "",
             *cpu_rows(results.get("throughput")), "",
             *measure_rows(*(results.get(k) or {} for k in ("scale", "recovery", "sse"))), "",
             *trace_lines(results.get("traces")), "",
             *handoff_lines(results.get("handoff")), "",
             *fairness_lines(results.get("fairness")), "",
             *agents_compare.report_lines(results.get("agents_compare"))]
    failed = failed_scripts(results)
    if failed:
        lines += ["", f"Did not produce results in this run: {', '.join(failed)} (see the run's output)."]
    return "\n".join(lines)


def failed_scripts(results: dict[str, dict[str, Any] | None]) -> list[str]:
    """The benchmarks of this run that produced no result, or reported an error."""
    return [name for name, value in results.items() if not value or "error" in value]


def interleaved(reps: int, quick: bool, folder: Path) -> dict[str, dict[str, Any] | None]:
    """PAL with its Celery peers, then DBOS, LangGraph and Restate, one repetition each in turn: this
    machine's speed drifts by 2x within minutes, and a drift must hit both sides of a ratio alike."""
    one = ["--quick"] if quick else ["--reps", "1"]
    kept: dict[str, list[dict[str, Any] | None]] = {name: [] for name in ("throughput", *PEERS)}
    for rep in range(reps):
        rep_folder = folder / f"rep{rep + 1}"
        rep_folder.mkdir()
        for name, results in kept.items():
            args = [*one, "--no-anatomy"] if name == "throughput" else one
            results.append(run_script(name, args, rep_folder))
    throughput = [result for result in kept.pop("throughput") if result is not None]
    merged: dict[str, dict[str, Any] | None] = {
        "throughput": merged_throughput(throughput) if throughput else None}
    merged.update({name: merged_peer(results) for name, results in kept.items()})
    return merged


def merged_throughput(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One table from several single-repetition runs: every sample kept, medians over them all."""
    table: dict[str, dict[str, Any]] = {}
    for result in results:
        for row in result["table"]:
            merged = table.setdefault(row["scenario"], {"scenario": row["scenario"], "samples": {},
                                                        "cpu_samples": {}})
            for kind, rates in row["samples"].items():
                merged["samples"].setdefault(kind, []).extend(rates)
            for kind, spent in row.get("cpu_samples", {}).items():
                merged["cpu_samples"].setdefault(kind, []).extend(spent)
    for row in table.values():
        row.update({kind: statistics.median(rates) for kind, rates in row["samples"].items()})
    return {"table": list(table.values())}


def merged_peer(results: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One result from a peer's single-repetition runs (bench/peers.py's shape): every sample, in
    repetition order, None where that repetition failed; medians over the rest. None when no run
    left a result; {"error": ...} when none succeeded."""
    good = [result for result in results if result and "error" not in result]
    errors = [result["error"] for result in results if result and "error" in result]
    if not good:
        return {"error": errors[-1]} if errors else None
    merged: dict[str, Any] = {"failed_reps": len(results) - len(good)}
    if merged["failed_reps"]:
        merged["last_error"] = errors[-1] if errors else "no result (see the run's output)"
    for name in ("linear", "concurrent"):
        rates = [result[name]["steps_per_s"][0] if result and "error" not in result else None
                 for result in results]
        spent = [ms for result in good for ms in result[name].get("cpu_ms_per_step", [])]
        merged[name] = {"steps_per_s": rates, "median": statistics.median(r for r in rates if r is not None)}
        if spent:
            merged[name]["cpu_ms_median"] = statistics.median(spent)
    return merged


def write_doc(block: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per measurement (default 3)")
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 rep: a smoke test")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    args = parser.parse_args(argv)
    reps = 1 if args.quick else args.reps
    if not 1 <= reps <= 20:
        parser.error("--reps must be between 1 and 20")
    sized = ["--quick"] if args.quick else ["--reps", str(reps)]
    plan: list[tuple[str, list[str]]] = [
        ("scale", sized), ("recovery", ["--kills", "5" if args.quick else "20"]),
        ("sse", ["--subscribers", "20" if args.quick else "100"]), ("traces", sized), ("handoff", sized),
        ("fairness", ["--flood", "1000" if args.quick else "10000",
                      "--probes", "20" if args.quick else "100"]),
        ("agents_compare", ["--quick"] if args.quick else ["--reps", str(reps)]),
    ]
    with tempfile.TemporaryDirectory(prefix="palbench-all-") as folder:
        results = interleaved(reps, args.quick, Path(folder))
        results |= {name: run_script(name, script_args, Path(folder)) for name, script_args in plan}
    block = report(results, reps, args.quick)
    print(block)
    if not args.no_write:
        write_doc(block)
        print(f"\nwritten to {DOC.relative_to(REPO)}", file=sys.stderr)
    failed = failed_scripts(results)
    if failed:  # said last, where it is seen: their rows read n/a, easy to miss in the table
        print(f"\nmake bench: FAILED: {', '.join(failed)} produced no results (see above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
