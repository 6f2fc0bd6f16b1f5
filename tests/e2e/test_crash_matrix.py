"""The crash matrix: every fault point by every node kind, under real SIGKILL.

One run per cell, all in flight together. Two prefork `pal worker`s are armed with every cell's
target (`point:step@run`): a pool process that reaches a target SIGKILLs itself (once per target),
Celery forks a replacement, and the beat-driven sweep re-drives the run. An approval's decision is
made by a `pal runs approve` subprocess, armed for the decider's own points (after its commit,
before it publishes the branch). When everything is terminal, each cell is checked: the fault
fired, the run ended as the protocol promises, `pal doctor` finds its journal clean, and the tool
logs and stand-in servers show how often each effect happened.

Effects a kill may repeat, by design (docs/guarantees.md): a plain tool or a model call killed
after it returned and before `step_completed` committed runs again (a model call with the same
Idempotency-Key). A delivery is never repeated: a kill between its receipt claim and its
confirmation fails the step as in doubt.

The workers run model calls awaited on their event loops (pal.engine.async_steps), each pool
process one step at a time (PAL_ASYNC_STEPS=1): a kill then cuts off its cell's step only, so each
cell's figures are its own kill's (tests/e2e/test_awaited_steps.py kills hundreds at once).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pal.client import Client
from pal.core.faults import STEP_POINTS
from pal.nodes import idempotency_key
from tests.conftest import REDIS_URL, Backend, fresh_schema, migrated_postgres_backend
from tests.support.graphs import counted, edge, single
from tests.support.processes import Processes
from tests.support.report import record
from tests.support.servers import FakeModelServer, SmtpReceiver, WebhookReceiver
from tests.support.tools import calls

KINDS = ("tool", "ai-step", "connector", "email", "subagent", "approval", "loop")
DELIVERY_KINDS = ("connector", "email")
# Where each kind's interesting step is: the loop's is iteration 2's body step.
TARGET_STEP = {kind: "x" for kind in KINDS} | {"loop": "x[1].work"}
# Points a decider (the `pal runs approve` process) reaches for an approval step.
DECIDER_POINTS = ("after_complete_commit", "before_publish")
ITEMS = [10, 20, 30]
DEADLINE_S = 300


@dataclass(frozen=True)
class Cell:
    kind: str
    point: str

    @property
    def run_id(self) -> str:
        return f"mx-{self.kind}-{self.point}"

    @property
    def target(self) -> str:
        step = "" if self.point == "during_finish" else f":{TARGET_STEP[self.kind]}"
        return f"{self.point}{step}@{self.run_id}"

    @property
    def decided_by_cli(self) -> bool:
        return self.kind == "approval" and self.point in DECIDER_POINTS


CELLS = ([Cell(kind, point) for kind in KINDS for point in STEP_POINTS]
         + [Cell(kind, point) for kind in DELIVERY_KINDS for point in ("after_receipt_claim", "after_delivery")]
         + [Cell("tool", "after_retry_commit")])


def expected(cell: Cell) -> tuple[str, int]:
    """(run status, how many times the cell's effect reached the world)."""
    if cell.kind in DELIVERY_KINDS:
        if cell.point == "after_receipt_claim":
            return "failed", 0  # claimed, never sent: in doubt all the same, nothing delivered
        if cell.point == "after_delivery":
            return "failed", 1  # sent, unconfirmed: in doubt, never sent again
        return "succeeded", 1
    if cell.kind == "tool" and cell.point == "after_retry_commit":
        return "succeeded", 2  # the failing first attempt, then the second
    repeats = cell.point == "after_effect" and cell.kind in ("tool", "ai-step", "loop")
    base = len(ITEMS) if cell.kind == "loop" else 1
    return "succeeded", base + (1 if repeats else 0)


def graph_of(cell: Cell, folder: Path, webhook_url: str) -> dict[str, Any]:
    log = folder / f"{cell.run_id}.log"
    if cell.kind == "tool" and cell.point == "after_retry_commit":
        return single({"id": "x", "type": "tool", "data": {
            "tool": "flaky", "args": {"path": str(log), "label": "x", "failures": 1},
            "retry": {"maxAttempts": 3, "backoffMs": 0}}})
    if cell.kind == "tool":
        return single(counted("x", log, 1))
    if cell.kind == "ai-step":
        return single({"id": "x", "type": "ai-step", "data": {
            "provider": "openai", "model": "gpt-4o-mini", "prompt": f"Hello from {cell.run_id}"}})
    if cell.kind == "connector":
        return single({"id": "x", "type": "connector", "data": {"url": webhook_url, "body": {"cell": cell.run_id}}})
    if cell.kind == "email":
        return single({"id": "x", "type": "email", "data": {
            "to": "ada@example.test", "subject": cell.run_id, "body": "matrix"}})
    if cell.kind == "subagent":
        # The child's tool logs into the parent's cell log.
        return single({"id": "x", "type": "subagent", "data": {"graph": single(counted("c", log, "child"))}})
    if cell.kind == "approval":
        return {"nodes": [{"id": "start", "type": "trigger"},
                          {"id": "x", "type": "approval", "data": {"prompt": f"Approve {cell.run_id}?"}},
                          counted("pay", log, "paid"),
                          {"id": "out", "type": "output", "data": {"value": "{{ nodes.pay.output.value }}"}}],
                "edges": [edge("start", "x"), edge("x", "pay", "approved"), edge("pay", "out")]}
    assert cell.kind == "loop"
    return single({"id": "x", "type": "loop", "data": {"items": "{{ input.items }}", "body": {
        "nodes": [{"id": "work", "type": "tool", "data": {"tool": "count", "args": {
            "path": str(log), "label": "item-{{ loop.index }}", "value": "{{ loop.item }}"}}}],
        "edges": []}}})


@dataclass
class Outcome:
    status: str
    error_code: str | None
    effects: int
    fired: bool
    recovered: int
    in_doubt: int
    children: int
    attempts: list[int]  # the attempt of each step_completed of the cell's step
    violations: list[dict[str, Any]]


@dataclass
class Matrix:
    outcomes: dict[Cell, Outcome]
    doctor: subprocess.CompletedProcess[str]
    kills: int


@pytest.fixture(scope="module")
def module_backend(tmp_path_factory: pytest.TempPathFactory, pg_admin: sa.Engine,
                   redis_client: redis.Redis) -> Iterator[Backend]:
    """A Postgres schema and Redis key prefix for the whole matrix, dropped at the end."""
    prefix = f"paltest:{uuid.uuid4().hex[:12]}:"
    with fresh_schema(pg_admin) as url:
        yield migrated_postgres_backend(tmp_path_factory.mktemp("matrix"), url, REDIS_URL, prefix)
    keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)


def _effects(cell: Cell, folder: Path, model: FakeModelServer, hooks: WebhookReceiver,
             smtp: SmtpReceiver, client: Client) -> tuple[int, int]:
    """(effects seen, children of the run)."""
    key = idempotency_key(cell.run_id, "x", 1)
    log = folder / f"{cell.run_id}.log"
    children = client.runtime.journal.runs.children(cell.run_id)
    if cell.kind == "ai-step":
        return model.idempotency_keys().count(key), 0
    if cell.kind == "connector":
        return hooks.idempotency_keys().count(key), 0
    if cell.kind == "email":
        return sum(1 for m in smtp.message_ids() if " ".join((m or "").split()) == f"<{key}@pal>"), 0
    return len(calls(log)), len(children)


@pytest.fixture(scope="module")
def matrix(module_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    folder = tmp_path_factory.mktemp("cells")
    procs = Processes(module_backend, folder)
    markers = folder / "fired"
    client = Client(module_backend.settings)
    with FakeModelServer() as model, WebhookReceiver() as hooks, SmtpReceiver() as smtp:
        procs.common |= {"PAL_OPENAI_BASE_URL": model.openai_base_url, "OPENAI_API_KEY": "sk-test",
                         "PAL_SMTP_URL": f"smtp://{smtp.host}:{smtp.port}"}
        worker_targets = [c.target for c in CELLS if not c.decided_by_cli]
        armed = {"PAL_FAULT_POINT": ",".join(worker_targets), "PAL_FAULT_ONCE_FILE": str(markers),
                 "PAL_ASYNC_STEPS": "1"}
        try:
            for name in ("w1", "w2"):
                procs.worker(name, concurrency=3, **armed)
            procs.beat()
            for cell in CELLS:
                client.start_run(graph_of(cell, folder, hooks.url), {"items": ITEMS}, run_id=cell.run_id)
            print(f"\ncrash matrix: {len(CELLS)} cells in flight, {len(worker_targets)} armed in the workers")
            _drive(procs, client, markers)
            doctor = procs.cli("doctor", "--json")
            found = json.loads(doctor.stdout or "[]")
            outcomes = {}
            for cell in CELLS:
                run = client.get_run(cell.run_id)
                events = client.events(cell.run_id)
                effects, children = _effects(cell, folder, model, hooks, smtp, client)
                ids = {cell.run_id} | {c.id for c in client.runtime.journal.runs.children(cell.run_id)}
                fired = (Path(f"{markers}.{worker_targets.index(cell.target)}").exists() if not cell.decided_by_cli
                         else (folder / f"decider-{cell.run_id}").exists())
                outcomes[cell] = Outcome(
                    status=run.status, error_code=(run.error or {}).get("code"), effects=effects, fired=fired,
                    recovered=sum(e.kind == "run_recovered" for e in events),
                    in_doubt=sum(e.kind == "step_in_doubt" for e in events), children=children,
                    attempts=[e.attempt or 0 for e in events
                              if e.kind == "step_completed" and e.step_id == TARGET_STEP[cell.kind]],
                    violations=[v for v in found if v["run_id"] in ids])
            kills = sum(o.fired for o in outcomes.values())
            for cell, o in outcomes.items():
                print(f"  {cell.kind:9} {cell.point:22} {o.status:9} effects={o.effects} "
                      f"recovered={o.recovered} fired={o.fired}")
            recoveries = sum(o.recovered for o in outcomes.values())
            record(f"crash matrix: {len(CELLS)} cells, {kills} SIGKILLs, {recoveries} recoveries, "
                   f"{len(found)} violations")
            yield Matrix(outcomes, doctor, kills)
        finally:
            procs.stop_all()
            client.close()


def _drive(procs: Processes, client: Client, markers: Path) -> None:
    """Approve waiting approvals (through `pal runs approve`, armed for decider cells) until every
    cell's run is terminal."""
    decided: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S
    pending = {c.run_id: c for c in CELLS}
    while pending and time.monotonic() < deadline:
        for run_id, cell in list(pending.items()):
            run = client.get_run(run_id)
            if run.terminal:
                del pending[run_id]
            elif cell.kind == "approval" and run_id not in decided and run.status == "waiting":
                extra = ({"PAL_FAULT_POINT": f"{cell.point}:x@{run_id}",
                          "PAL_FAULT_ONCE_FILE": str(procs.folder / f"decider-{run_id}")}
                         if cell.decided_by_cli else {})
                result = procs.cli("runs", "approve", run_id, "x", "--by", "matrix", **extra)
                assert result.returncode == (-9 if cell.decided_by_cli else 0), result.stderr
                decided.add(run_id)
        time.sleep(0.3)
    assert not pending, f"not terminal after {DEADLINE_S}s: {sorted(pending)}"


def test_pal_doctor_finds_the_whole_matrix_clean(matrix: Matrix) -> None:
    assert matrix.doctor.returncode == 0, matrix.doctor.stdout + matrix.doctor.stderr
    assert json.loads(matrix.doctor.stdout) == []
    assert matrix.kills == len(CELLS)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c.kind}-{c.point}")
def test_cell(matrix: Matrix, cell: Cell) -> None:
    outcome = matrix.outcomes[cell]
    status, effects = expected(cell)
    assert outcome.fired, f"{cell.target} never fired"
    assert outcome.violations == []
    assert outcome.status == status, outcome
    assert outcome.effects == effects, outcome
    if cell.point == "after_retry_commit":
        # The kill came between step_retrying and the next publish: the next attempt is 2, not 1
        # again (the redelivered message or the sweep may carry it).
        assert outcome.attempts == [2]
    else:
        assert outcome.recovered >= 1, "the run finished without a recovery: the kill cost nothing?"
    if cell.kind in DELIVERY_KINDS:
        assert outcome.in_doubt == (1 if status == "failed" else 0)
        if status == "failed":
            assert outcome.error_code == "delivery_in_doubt"
    if cell.kind == "subagent":
        assert outcome.children == 1  # a re-driven parent finds its child, never spawns a second
