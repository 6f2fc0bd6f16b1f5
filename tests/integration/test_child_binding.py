"""A subagent step's child run is bound to its parent step and tenant, where it is created and where
its result is read: a run someone else placed under the derived id is never adopted. (A caller can
no longer choose such an id at all: tests/e2e/test_tenant_isolation.py.) docs/security.md."""

from __future__ import annotations

from pathlib import Path

from pal.client import Client
from pal.core.clock import utcnow
from pal.engine.runs import child_run_id
from pal.engine.steps import execute_step
from pal.engine.waiting import wake
from pal.storage.schema import journal_events
from tests.support.graphs import parent_of, single
from tests.support.tools import calls

CHILD = single({"id": "c", "type": "output", "data": {"value": "the real child"}})


def _intruder_run(client: Client, run_id: str) -> None:
    """A finished run of another tenant under `run_id`, as an older PAL let a caller create."""
    journal = client.runtime.journal
    journal.runs.create_run(run_id=run_id, tenant_id="intruder", kind="graph", graph=CHILD, graph_hash=None,
                            run_input={"planted": True}, now=utcnow(), lease_ttl=30)


def test_a_subagent_never_adopts_a_run_planted_under_its_childs_id(client: Client, counter: Path) -> None:
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    planted = child_run_id("parent-1", "sub", 1)
    _intruder_run(client, planted)
    run_id = client.start_run(parent_of(CHILD), {}, run_id="parent-1")
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    run = client.get_run(run_id)
    assert run.status == "failed"
    assert "not available" in run.error["message"]
    assert client.runtime.journal.runs.children(run_id) == []
    intruder = client.get_run(planted)
    assert (intruder.tenant_id, intruder.parent_run_id, intruder.input) == ("intruder", None, {"planted": True})


def test_a_parked_subagent_reads_only_its_own_childs_result(client: Client, counter: Path) -> None:
    sent: list[tuple[str, str, int]] = []
    client.runtime.publish = lambda r, s, g, countdown=0.0: sent.append((r, s, g))
    run_id = client.start_run(parent_of(CHILD), {})
    execute_step(client.runtime, *sent.pop(0))  # the trigger
    execute_step(client.runtime, *sent.pop(0))  # sub: starts its child and parks
    assert client.get_run(run_id).status == "waiting"
    _intruder_run(client, "someone-elses")
    with client.runtime.journal.engine.begin() as conn:  # the waiting step now names a stranger
        conn.execute(journal_events.update().where(
            journal_events.c.run_id == run_id, journal_events.c.kind == "step_waiting").values(
            payload={"kind": "subagent", "child_run_id": "someone-elses"}))
    wake(client.runtime, run_id)
    while sent:
        execute_step(client.runtime, *sent.pop(0))
    run = client.get_run(run_id)
    assert run.status == "failed"
    assert run.error["code"] == "child_run_foreign"
    assert calls(counter) == []
