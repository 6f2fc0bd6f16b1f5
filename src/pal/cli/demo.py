"""`pal demo`: triage support tickets with an agent graph on the embedded default, crash the worker
in the middle of a step, recover, and decide the approvals.

The graph is in pal.cli.demo_graph, its tools in pal.cli.demo_tools (registered only by the demo).
The demo starts its own `pal worker` process, so every node is one Celery message handled by another
process. While one run's slow CRM lookup is running it kills that worker (SIGKILL, the pool children
too), starts a new one, and runs one pass of the orphan sweep (what celery beat sends every
PAL_RECOVERY_INTERVAL) once the dead worker's lease has expired: the run goes on from the step that
was cut off, and the tool ledger shows that no finished step ran again. Urgent tickets wait at an
approval; the demo prints each one's prompt, what it shows and the command a person would type, and
decides it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from pal.cli import common
from pal.cli.common import EXIT_RUN_FAILED, EXIT_TIMEOUT
from pal.cli.demo_graph import (
    DEMO_TICKETS,
    LEDGER_VARIABLE,
    SLOW_CUSTOMER,
    demo_model,
    ledger_counts,
    triage_graph,
)
from pal.storage.private_files import private_folder

DEMO_LEASE_TTL = "3s"  # short, so the demo's recovery comes seconds after the crash, not 30 s
CRASHED_STEP = "customer"
DEMO_SWEEP_EVERY_S = 1.0  # after the crash, the demo sweeps as often as a demo's beat would
VERBS = {"approved": "approve", "rejected": "reject"}  # the `pal runs` command of each decision


def start_worker_process(home: Path, concurrency: int = 2, *, ledger: Path | None = None,
                         lease_ttl: str | None = None) -> subprocess.Popen[bytes]:
    """A `pal worker` in a session of its own, so the demo can kill it with its pool children."""
    env = dict(os.environ)
    modules = [m for m in env.get("PAL_TOOL_MODULES", "").split(",") if m]
    env["PAL_TOOL_MODULES"] = ",".join([*modules, "pal.cli.demo_tools"])
    if ledger is not None:
        env[LEDGER_VARIABLE] = str(ledger)
    if lease_ttl is not None:
        env["PAL_LEASE_TTL"] = lease_ttl
    log_path = home / "demo-worker.log"
    private_folder(log_path.parent)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "pal.cli", "worker", "--concurrency", str(concurrency)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and every process of its session (a worker's pool children)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_until(predicate: Any, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


def pal_command() -> str:
    """How to type `pal` in this shell: `pal` if that is this installation on PATH, else its path
    (relative when it is under the current folder: `.venv/bin/pal` after `make demo`)."""
    here = Path(sys.executable).parent / "pal"
    on_path = shutil.which("pal")
    if on_path and Path(on_path).resolve() == here.resolve():
        return "pal"
    try:
        return str(here.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(here.absolute())


class _Watch:
    """Prints every run's new journal events, and answers what has happened so far."""

    def __init__(self, client: Any, names: dict[str, str], emit: Callable[[str], None]) -> None:
        from pal.cli.progress import describe

        self.client, self.names, self.emit, self.describe = client, names, emit, describe
        self.seen = dict.fromkeys(names, 0)
        self.started: set[tuple[str, str]] = set()

    def drain(self) -> bool:
        """Print what landed; True when every run has finished."""
        for run_id, last in self.seen.items():
            for event in self.client.events(run_id, last):
                self.emit(f"  [{self.names[run_id]}] {self.describe(event)}")
                self.seen[run_id] = event.seq
                if event.kind == "step_started" and event.step_id:
                    self.started.add((run_id, event.step_id))
        return all(self.client.get_run(r).terminal for r in self.names)


def _crash_and_recover(client: Any, watch: _Watch, run_id: str, worker: subprocess.Popen[bytes],
                       home: Path, ledger: Path, timeout: float, say: Callable[[str], None],
                       ) -> subprocess.Popen[bytes]:
    """Kill the worker while `run_id` runs CRASHED_STEP; start another; sweep once the lease lapsed."""
    from pal.core.clock import utcnow

    ticket = watch.names[run_id]

    def only_the_lookup_in_flight() -> bool:
        # The other tickets have finished or wait for a person: the kill cuts off one step only.
        watch.drain()
        others = (client.get_run(other) for other in watch.names if other != run_id)
        return (run_id, CRASHED_STEP) in watch.started and all(
            run.terminal or run.status == "waiting" for run in others)

    if not wait_until(only_the_lookup_in_flight, timeout):
        common.fail(f"{ticket} never ran {CRASHED_STEP} alone; see {home}/demo-worker.log", EXIT_TIMEOUT)
    say(f">>> CRASH: kill -9 the worker (pid {worker.pid} and its pool children) while "
        f"[{ticket}] runs {CRASHED_STEP!r}, a slow CRM lookup")
    kill_process_group(worker)
    worker = start_worker_process(home, ledger=ledger, lease_ttl=DEMO_LEASE_TTL)
    say(f"started a new worker (pid {worker.pid}); the dead worker's lease on [{ticket}] lapses within "
        f"{DEMO_LEASE_TTL}, and nobody will finish {CRASHED_STEP!r} until the sweep takes the run over")

    def lease_lapsed() -> bool:
        watch.drain()
        lease = client.runtime.control.get_lease(run_id)
        return lease is None or lease.expires_at <= utcnow()

    if not wait_until(lease_lapsed, timeout):
        common.fail(f"the lease of {run_id} never lapsed", EXIT_TIMEOUT)
    sweep_once(client, watch, say)
    return worker


def sweep_once(client: Any, watch: _Watch, say: Callable[[str], None]) -> None:
    """One pass of the orphan sweep, as celery beat sends it, saying what it took over."""
    from pal.engine.recovery import sweep

    for recovered_id, recovery in sweep(client.runtime).recovered.items():
        say(f">>> RECOVERY: the orphan sweep (celery beat runs it every PAL_RECOVERY_INTERVAL; "
            f"the demo ran one pass now) took over [{watch.names.get(recovered_id, recovered_id)}] at "
            f"lease generation {recovery.generation}; it resumes {', '.join(recovery.resumed_steps)} "
            "and reuses the saved result of every finished step")


def _decide_approvals(client: Any, watch: _Watch, decided: set[tuple[str, str]], pal: str,
                      say: Callable[[str], None]) -> None:
    """Decide each new pending approval as a person would: approve incidents, hold the rest."""
    for run_id, ticket in watch.names.items():
        for pending in client.pending_approvals(run_id):
            if (run_id, pending.step_id) in decided:
                continue
            decided.add((run_id, pending.step_id))
            approve = "down" in str(pending.show).lower() or "500" in str(pending.show)
            decision = "approved" if approve else "rejected"
            comment = ("production is down: page now" if approve
                       else "billing can wait for office hours; no page")
            say(f">>> APPROVAL: [{ticket}] waits at {pending.step_id!r}: {pending.prompt}\n"
                f"    it shows: {pending.show}\n"
                f"    a person decides with: {pal} runs {VERBS[decision]} {run_id} {pending.step_id} "
                f"--comment '...'\n"
                f"    the demo decides: {VERBS[decision]}, comment {comment!r}")
            client.decide(run_id, pending.step_id, decision, comment=comment, by="demo")


def demo(
    tickets: Annotated[int, typer.Option(min=1, max=len(DEMO_TICKETS),
                                         help="How many tickets to triage.")] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each phase.")] = 120.0,
    crash: Annotated[bool, typer.Option(help="Kill the worker mid-step and recover.")] = True,
) -> None:
    """Triage support tickets with an agent graph (one node per Celery message), kill the worker
    mid-step and recover, decide the approvals, and print the journal. Uses the embedded default
    (SQLite + filesystem broker) unless PAL_* say otherwise."""
    importlib.import_module("pal.cli.demo_tools")  # the demo's tools, known here for validation
    from pal.cli.progress import console, journal_table
    from pal.storage.database import shared_engine
    from pal.storage.schema.migrate import upgrade

    settings = common.settings()
    out = console()

    def say(text: Any) -> None:
        out.print(text, soft_wrap=True)  # a long line stays one line, for a pipe or a test as well

    say(f"PAL demo: journal {settings.database_url}, broker {settings.broker_url}")
    upgrade(shared_engine(settings.database_url))
    ledger = settings.home / "demo-ledger.jsonl"
    ledger.unlink(missing_ok=True)
    say(f"schema up to date; starting a `pal worker` process (2 children, lease {DEMO_LEASE_TTL})…")
    worker = start_worker_process(settings.home, ledger=ledger, lease_ttl=DEMO_LEASE_TTL)
    pal = pal_command()
    try:
        client = common.client()
        provider, model = demo_model()
        say(f"replies are drafted by an ai-step: provider {provider}, model {model}"
                  + (" (offline; set OPENAI_API_KEY or ANTHROPIC_API_KEY for a real one)"
                     if provider == "scripted" else ""))
        graph = triage_graph(provider, model)
        names: dict[str, str] = {}
        for ticket in DEMO_TICKETS[:tickets]:
            run_id = client.start_run(graph, ticket)
            names[run_id] = ticket["id"]
            say(f"queued {run_id} for ticket {ticket['id']}: {ticket['text']!r}")
        watch = _Watch(client, names, say)
        slow = [r for r, t in names.items() if t == "T-1003"]
        if crash and slow:
            worker = _crash_and_recover(client, watch, slow[0], worker, settings.home, ledger, timeout,
                                        say)
        decided: set[tuple[str, str]] = set()
        last_sweep = [time.monotonic()]

        def drive() -> bool:
            finished = watch.drain()
            _decide_approvals(client, watch, decided, pal, say)
            if crash and not finished and time.monotonic() - last_sweep[0] >= DEMO_SWEEP_EVERY_S:
                last_sweep[0] = time.monotonic()  # beat's job, should anything else have been cut off
                sweep_once(client, watch, say)
            return finished

        if not wait_until(drive, timeout):
            common.fail(f"runs not finished after {timeout:g}s; see {settings.home}/demo-worker.log",
                        EXIT_TIMEOUT)
        failed = _summary(client, names, ledger, out.print, journal_table)
        _suggest(pal, slow[0] if slow else next(iter(names)), settings, say)
        if failed:
            raise typer.Exit(EXIT_RUN_FAILED)
    finally:
        stop_process(worker)


def _summary(client: Any, names: dict[str, str], ledger: Path, say: Callable[[Any], None],
             journal_table: Any) -> int:
    failed = 0
    for run_id, ticket_id in names.items():
        record = client.get_run(run_id)
        failed += record.status != "succeeded"
        say(journal_table(client.events(run_id),
                          f"journal of {run_id} (ticket {ticket_id}): {record.status}, "
                          f"{record.input_tokens}+{record.output_tokens} tokens, ${record.cost_usd:.6f}"))
    counts = ledger_counts(ledger)
    say("tool calls, from the ledger the tools append to:")
    for (name, key), n in sorted(counts.items()):
        why = (" (the call the crash cut off, then its re-run)" if n > 1 and key == SLOW_CUSTOMER
               else "")
        say(f"  {name}({key!r}): {n}{why}")
    say(f"{len(names) - failed} of {len(names)} runs succeeded; each step above was one Celery message, "
        "and no step that had finished ran again after the crash.")
    return failed


def _suggest(pal: str, run_id: str, settings: Any, say: Callable[[str], None]) -> None:
    if settings.database_url.startswith("sqlite:"):
        say("(`make demo` ignores PAL_DATABASE_URL and PAL_BROKER_URL; if this shell sets them, unset "
            "them before pasting the commands below)")
    say(f"Look around (from this folder; the journal is in {settings.home}):\n"
        f"  {pal} runs list\n"
        f"  {pal} runs show {run_id}\n"
        f"  {pal} runs events {run_id}\n"
        f"  {pal} doctor")
