"""The soak: a stream of mixed-graph runs while a chaos loop SIGKILLs workers, flushes Redis once
and restarts Postgres once; at the end every run is terminal, `pal doctor` is clean, and no effect
that PAL promises to make once happened twice.

Bounded: PAL_SOAK_DURATION of chaos (default 30s, under a minute in all; `make soak DURATION=10m`),
PAL_SOAK_RUNS runs per 45 s of it (default 200), then a bounded wait for the last runs. PAL_SOAK_SEED replays a failure:
the seed is printed first, and it decides the kill times, which worker dies, and the inputs.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pal.cli.demo import stop_process
from pal.client import Client
from pal.core.durations import parse_go_duration
from pal.nodes import idempotency_key
from tests.conftest import Backend, fresh_schema, migrated_postgres_backend
from tests.support.graphs import edge
from tests.support.processes import Processes
from tests.support.report import record
from tests.support.servers import FakeModelServer, WebhookReceiver
from tests.support.tools import calls

# A Redis database of its own: the soak flushes it, which must not touch any other test's keys.
SOAK_REDIS_URL = "redis://127.0.0.1:6379/11"
RESTART_PG = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart"
WORKERS = 3
SETTLE_S = 240  # how long the last runs may take once the chaos stops


@dataclass
class Chaos:
    kills: int = 0
    redis_flushes: int = 0
    postgres_restarts: int = 0
    log: list[str] = field(default_factory=list)


def mixed_graph(log: Path, strict_url: str, idempotent_url: str) -> dict[str, Any]:
    """start -> count -> think (a nap) -> ask (model) -> hook (idempotent receiver) -> notify (strict receiver)
    -> each (a loop of two counted items) -> sub (a subagent counting once) -> out."""
    nodes = [
        {"id": "start", "type": "trigger"},
        _count("count", log, "count-{{ input.n }}"),
        # A step that takes a while, so that kills find steps running, not only queued messages.
        {"id": "think", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 0.2}}},
        {"id": "ask", "type": "ai-step", "data": {"provider": "openai", "model": "gpt-4o-mini",
                                                 "prompt": "Reply to ticket {{ input.n }}"}},
        {"id": "hook", "type": "connector", "data": {"url": idempotent_url, "idempotentReceiver": True,
                                                     "body": {"n": "{{ input.n }}"}}},
        {"id": "notify", "type": "connector", "data": {"url": strict_url, "body": {"n": "{{ input.n }}"}}},
        {"id": "each", "type": "loop", "data": {"items": "{{ input.items }}", "body": {
            "nodes": [_count("work", log, "item-{{ input.n }}-{{ loop.index }}")], "edges": []}}},
        {"id": "sub", "type": "subagent", "data": {"input": {"n": "{{ input.n }}"}, "graph": {
            "nodes": [{"id": "start", "type": "trigger"}, _count("child", log, "child-{{ input.n }}"),
                      {"id": "out", "type": "output", "data": {"value": "{{ nodes.child.output.value }}"}}],
            "edges": [edge("start", "child"), edge("child", "out")]}}},
        {"id": "out", "type": "output", "data": {"value": "{{ nodes.sub.output }}"}},
    ]
    order = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [edge(a, b) for a, b in itertools.pairwise(order)]}


def _count(node_id: str, log: Path, label: str) -> dict[str, Any]:
    return {"id": node_id, "type": "tool", "data": {"tool": "count", "args": {"path": str(log), "label": label}}}


def _labels(n: int) -> list[str]:
    """The tool calls a succeeded run `n` makes, each once unless a kill repeated it."""
    return [f"count-{n}", f"item-{n}-0", f"item-{n}-1", f"child-{n}"]


@pytest.fixture
def soak_backend(tmp_path: Path, pg_admin: sa.Engine) -> Iterator[Backend]:
    redis.Redis.from_url(SOAK_REDIS_URL).flushdb()
    with fresh_schema(pg_admin) as url:
        yield migrated_postgres_backend(tmp_path, url, SOAK_REDIS_URL)
    redis.Redis.from_url(SOAK_REDIS_URL).flushdb()


def _chaos_step(rng: random.Random, procs: Processes, workers: dict[str, subprocess.Popen[bytes]],
                chaos: Chaos, started: float) -> None:
    name = rng.choice(sorted(workers))
    workers[name].kill()  # SIGKILL: no chance to clean up, its lease and message are left behind
    workers[name].wait(timeout=30)
    chaos.kills += 1
    chaos.log.append(f"{time.monotonic() - started:6.1f}s SIGKILL {name}")
    workers[name] = procs.worker(name)


@pytest.mark.disruptive  # restarts Postgres: run alone (tests/run_suite.py)
def test_soak_under_sigkill_redis_flush_and_postgres_restart(
        soak_backend: Backend, tmp_path: Path, pg_admin: sa.Engine) -> None:
    duration = parse_go_duration(os.environ.get("PAL_SOAK_DURATION", "30s"))
    per_default = int(os.environ.get("PAL_SOAK_RUNS", "200"))
    seed = int(os.environ.get("PAL_SOAK_SEED") or random.SystemRandom().randrange(1, 2**31))
    total = max(1, round(per_default * duration / 45))
    record(f"soak: seed {seed} (replay with PAL_SOAK_SEED={seed}), {duration:.0f}s of chaos, {total} runs")
    rng = random.Random(seed)
    log = tmp_path / "effects.log"
    procs = Processes(soak_backend, tmp_path)
    client = Client(soak_backend.settings)
    chaos = Chaos()
    with FakeModelServer() as model, WebhookReceiver() as strict, WebhookReceiver() as idempotent:
        procs.common |= {"PAL_OPENAI_BASE_URL": model.openai_base_url, "OPENAI_API_KEY": "sk-test"}
        graph = mixed_graph(log, strict.url, idempotent.url)
        try:
            workers = {f"w{i}": procs.worker(f"w{i}") for i in range(WORKERS)}
            procs.beat()
            run_ids: list[str] = []
            started = time.monotonic()
            next_kill = started + rng.uniform(2, 5)
            flush_at, restart_at = started + duration / 3, started + 2 * duration / 3
            while (now := time.monotonic()) < started + duration:
                due = min(total, int(total * (now - started) / (0.8 * duration)) + 1)
                while len(run_ids) < due:
                    n = len(run_ids)
                    run_ids.append(client.start_run(graph, {"n": n, "items": [rng.randrange(100), n]},
                                                    run_id=f"soak-{seed}-{n}"))
                if now >= next_kill:
                    _chaos_step(rng, procs, workers, chaos, started)
                    next_kill = time.monotonic() + rng.uniform(2, 5)
                if now >= flush_at and not chaos.redis_flushes:
                    redis.Redis.from_url(SOAK_REDIS_URL).flushdb()  # every queued message is gone
                    chaos.redis_flushes += 1
                    chaos.log.append(f"{now - started:6.1f}s FLUSHDB")
                if now >= restart_at and not chaos.postgres_restarts:
                    subprocess.run(RESTART_PG, shell=True, check=True, timeout=120)
                    pg_admin.dispose()
                    client.runtime.journal.engine.dispose()  # this process's connections died too
                    chaos.postgres_restarts += 1
                    chaos.log.append(f"{time.monotonic() - started:6.1f}s Postgres restarted")
                time.sleep(0.1)
            unfinished = _settle(client, run_ids)
            doctor = procs.cli("doctor", "--json")
        finally:
            for process in procs.started:
                stop_process(process)
        report = _report(client, run_ids, model, strict, idempotent, log)
    client.close()
    record("soak chaos: " + "; ".join(chaos.log))
    record(f"soak: runs {len(run_ids)} (+{report['children']} children), succeeded {report['succeeded']}, "
          f"failed in doubt {report['in_doubt']}, kills {chaos.kills}, redis flushes {chaos.redis_flushes}, "
          f"postgres restarts {chaos.postgres_restarts}, recoveries {report['recoveries']}, "
          f"redeliveries {report['redeliveries']}, "
          f"tool re-executions {report['tool_repeats']}, violations {len(json.loads(doctor.stdout or '[]'))}")
    assert unfinished == [], f"seed {seed}: not terminal after the chaos: {unfinished[:10]}"
    assert doctor.returncode == 0, f"seed {seed}: {doctor.stdout}{doctor.stderr}"
    assert chaos.kills >= duration / 6 and chaos.redis_flushes == 1 and chaos.postgres_restarts == 1
    assert report["other_failures"] == [], f"seed {seed}: {report['other_failures'][:5]}"
    assert report["twice"] == [], f"seed {seed}: effects that happened twice: {report['twice'][:10]}"
    assert report["missing"] == [], f"seed {seed}: succeeded without their effect: {report['missing'][:10]}"


def _settle(client: Client, run_ids: list[str]) -> list[str]:
    """Wait (bounded) until every run and every child is terminal; returns those that are not."""
    deadline = time.monotonic() + SETTLE_S
    pending = set(run_ids)
    while pending and time.monotonic() < deadline:
        for run_id in list(pending):
            run = client.get_run(run_id)
            if run.terminal and all(c.terminal for c in client.runtime.journal.runs.children(run_id)):
                pending.discard(run_id)
        time.sleep(0.5)
    return sorted(pending)


def _report(client: Client, run_ids: list[str], model: FakeModelServer, strict: WebhookReceiver,
            idempotent: WebhookReceiver, log: Path) -> dict[str, Any]:
    """Compare what the outside world saw with what each run's journal says happened."""
    keys_to_model = Counter(model.idempotency_keys())
    strict_keys = Counter(strict.idempotency_keys())
    effective = Counter(r.headers.get("idempotency-key") for r in idempotent.effective_deliveries())
    report: dict[str, Any] = {"succeeded": 0, "in_doubt": 0, "other_failures": [], "twice": [],
                              "missing": [], "recoveries": 0, "redeliveries": 0, "children": 0}
    tool_calls = Counter(calls(log))
    for n, run_id in enumerate(run_ids):
        run = client.get_run(run_id)
        kinds = [e.kind for e in client.events(run_id)]
        report["recoveries"] += kinds.count("run_recovered")
        report["redeliveries"] += kinds.count("run_redelivered")
        report["children"] += len(client.runtime.journal.runs.children(run_id))
        ask, hook, notify = (idempotency_key(run_id, step, 1) for step in ("ask", "hook", "notify"))
        if strict_keys[notify] > 1:  # a receiver that does not de-duplicate got it twice
            report["twice"].append((run_id, "notify", strict_keys[notify]))
        if effective[hook] > 1 or len(client.runtime.journal.runs.children(run_id)) > 1:
            report["twice"].append((run_id, "hook/sub", effective[hook]))
        if run.status == "succeeded":
            report["succeeded"] += 1
            if not (keys_to_model[ask] and effective[hook] == 1 and strict_keys[notify] == 1
                    and all(tool_calls[label] for label in _labels(n))):
                report["missing"].append(run_id)
        elif (run.error or {}).get("code") == "delivery_in_doubt":
            report["in_doubt"] += 1
        else:
            report["other_failures"].append((run_id, run.status, run.error))
    # Model calls carry one key per step attempt: no key of a step other than attempt 1 was ever sent.
    expected_keys = {idempotency_key(r, "ask", 1) for r in run_ids}
    report["twice"] += [("unexpected model key", k) for k in keys_to_model if k not in expected_keys]
    # A plain tool killed after it returned and before its step_completed committed runs again:
    # allowed (docs/guarantees.md), and reported.
    report["tool_repeats"] = sum(c - 1 for c in tool_calls.values())
    return report
