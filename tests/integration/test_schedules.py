"""Schedules fired by `fire_due` on SQLite and Postgres (beat's task calls it): one run per tick
however many passes fire it, each overlap policy, catch-up after downtime on or off, pause and
resume, a schedule added again, and hostile schedules refused with nothing written."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from pal.client import Client
from pal.core.records import Schedule
from pal.engine import schedules as schedules_module
from pal.engine.schedules import add_schedule, delete_schedule, fire_due, pause, resume, tick_run_id
from pal.errors import GraphError, InputError, Refused, ScheduleNotFound
from pal.storage.schema import schedules
from tests.conftest import Backend

GRAPH = {"nodes": [{"id": "t", "type": "trigger"}, {"id": "o", "type": "output", "data": {"value": "hi"}}],
         "edges": [{"source": "t", "target": "o"}]}


@pytest.fixture
def client(backend: Backend) -> Iterator[Client]:
    client = Client(backend.settings)
    yield client
    client.close()


def add(client: Client, name: str = "daily", **options: Any) -> Schedule:
    return add_schedule(client.runtime, tenant_id="acme", name=name, cron=options.pop("cron", "0 9 * * *"),
                        graph=GRAPH, **options)


def runs_of(client: Client) -> list[str]:
    return sorted(r.id for r in client.list_runs(limit=500))


def test_a_tick_starts_one_run_however_many_passes_fire_it(client: Client) -> None:
    schedule = add(client, run_input={"report": "sales"})
    due = schedule.next_at
    passes = [threading.Thread(target=fire_due, args=(client.runtime, due + timedelta(seconds=1)))
              for _ in range(4)]
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join(timeout=60)
    fire_due(client.runtime, due + timedelta(seconds=2))  # a late beat: the tick is gone
    assert runs_of(client) == [tick_run_id(schedule, due)]
    run = client.get_run(tick_run_id(schedule, due))
    assert (run.tenant_id, run.input) == ("acme", {"report": "sales"})
    after = client.runtime.journal.schedules.get("acme", "daily")
    assert after.next_at == due + timedelta(days=1) and after.last_run_id == run.id


def test_overlap_skip_queue_and_cancel(client: Client) -> None:
    """Runs here are never executed (no worker): the first tick's run stays queued, in flight."""
    for policy in ("skip", "queue", "cancel"):
        add(client, policy, cron="*/5 * * * *", overlap=policy)
    first = {name: client.runtime.journal.schedules.get("acme", name) for name in ("skip", "queue", "cancel")}
    tick = first["skip"].next_at
    fire_due(client.runtime, tick)
    fire_due(client.runtime, tick + timedelta(minutes=5))
    skip, queue, cancel = (client.runtime.journal.schedules.get("acme", n) for n in ("skip", "queue", "cancel"))
    assert skip.last_run_id == tick_run_id(first["skip"], tick) and skip.skipped == 1
    assert skip.next_at == tick + timedelta(minutes=10)
    assert queue.next_at == tick + timedelta(minutes=5)  # waits for its previous run
    assert cancel.last_run_id == tick_run_id(first["cancel"], tick + timedelta(minutes=5))
    cancelled = client.get_run(tick_run_id(first["cancel"], tick))
    assert cancelled.status == "cancelled" and cancelled.error["by"] == "schedule:cancel"
    client.cancel(queue.last_run_id)  # the previous run ends: the queued tick starts at the next pass
    fire_due(client.runtime, tick + timedelta(minutes=6))
    queue = client.runtime.journal.schedules.get("acme", "queue")
    assert queue.last_run_id == tick_run_id(first["queue"], tick + timedelta(minutes=5))
    assert queue.next_at == tick + timedelta(minutes=10)


def test_downtime_gives_one_run_or_with_catch_up_one_per_missed_tick(client: Client) -> None:
    """The catch-up's runs never execute here (no worker): a run it started itself does not count as
    the previous run in flight, so each missed tick gets its run, none cancelled or skipped."""
    once = add(client, "once", cron="0 * * * *", overlap="cancel")
    every = add(client, "every", cron="0 * * * *", overlap="cancel", catch_up=True)
    skipping = add(client, "skipping", cron="0 * * * *", catch_up=True)
    later = once.next_at + timedelta(hours=3, minutes=30)  # four ticks missed
    fire_due(client.runtime, later)
    assert client.runtime.journal.schedules.get("acme", "once").next_at == once.next_at + timedelta(hours=4)
    assert client.runtime.journal.schedules.get("acme", "every").next_at == every.next_at + timedelta(hours=4)
    ran = runs_of(client)
    assert tick_run_id(once, once.next_at) in ran
    for catching_up in (every, skipping):
        assert {tick_run_id(catching_up, catching_up.next_at + timedelta(hours=h)) for h in range(4)} <= set(ran)
    assert len(ran) == 9
    assert {client.get_run(run_id).status for run_id in ran} == {"queued"}
    assert client.runtime.journal.schedules.get("acme", "skipping").skipped == 0


def test_pause_resume_delete_and_add_again(client: Client) -> None:
    schedule = add(client)
    pause(client.runtime, "acme", "daily")
    fire_due(client.runtime, schedule.next_at + timedelta(days=3))
    assert runs_of(client) == []
    resumed = resume(client.runtime, "acme", "daily")
    assert not resumed.paused and resumed.next_at >= schedule.next_at
    fire_due(client.runtime, resumed.next_at)
    assert runs_of(client) == [tick_run_id(resumed, resumed.next_at)]
    delete_schedule(client.runtime, "acme", "daily")
    with pytest.raises(ScheduleNotFound):
        resume(client.runtime, "acme", "daily")
    again = add(client)  # the same name and cron: its ticks are new runs, not the old ones
    assert tick_run_id(again, again.next_at) != tick_run_id(resumed, again.next_at)
    assert len(runs_of(client)) == 1  # the deleted schedule's run stays


def test_schedules_are_the_tenants_own(client: Client) -> None:
    add(client)
    add_schedule(client.runtime, tenant_id="globex", name="daily", cron="@daily", graph=GRAPH)
    with pytest.raises(Refused, match="exists"):
        add(client)
    for act in (pause, resume, delete_schedule):
        with pytest.raises(ScheduleNotFound):
            act(client.runtime, "initech", "daily")
    assert client.runtime.journal.schedules.get("globex", "daily").cron == "@daily"


@pytest.mark.parametrize("options, error, says", [
    ({"name": "has space"}, InputError, "1 to 64 letters"),
    ({"name": "x" * 65}, InputError, "1 to 64 letters"),
    ({"name": None}, InputError, "1 to 64 letters"),
    ({"cron": "0 0 30 2 *"}, InputError, "does not run within five years"),
    ({"cron": "* * * * * * *"}, InputError, "five fields"),
    ({"cron": "1" * 200}, InputError, "1 to 128"),
    ({"timezone": "../../etc/passwd"}, InputError, "IANA name"),
    ({"timezone": "Nowhere/Place"}, InputError, "unknown time zone"),
    ({"overlap": "allow"}, InputError, "skip, queue, cancel"),
    ({"catch_up": "yes"}, InputError, "true or false"),
    ({"run_input": {"blob": "x" * 2_000_000}}, InputError, "over the limit"),
    ({"graph": {"nodes": []}}, GraphError, "non-empty 'nodes'"),
])
def test_a_bad_schedule_is_refused_and_writes_nothing(client: Client, options: dict[str, Any],
                                                       error: type[Exception], says: str) -> None:
    values = {"tenant_id": "acme", "name": "daily", "cron": "@daily", "graph": GRAPH} | options
    with pytest.raises(error) as info:
        add_schedule(client.runtime, **values)
    assert says in str(info.value)
    assert client.runtime.journal.schedules.of_tenant("acme") == []


def test_a_tick_whose_graph_no_longer_validates_is_passed_with_its_error(client: Client) -> None:
    schedule = add(client)
    with client.runtime.journal.engine.begin() as conn:  # a tool unregistered since: as if stored so
        broken = {"nodes": [{"id": "t", "type": "trigger"}, {"id": "x", "type": "tool", "data": {"tool": "gone"}}],
                  "edges": [{"source": "t", "target": "x"}]}
        conn.execute(schedules.update().values(graph=broken))
    report = fire_due(client.runtime, schedule.next_at)
    assert report.started == [] and "gone" in report.failed["daily"]
    after = client.runtime.journal.schedules.get("acme", "daily")
    assert after.next_at > schedule.next_at and "gone" in (after.last_error or "")
    assert runs_of(client) == []


def test_caller_chosen_run_ids_cannot_take_a_ticks_id(client: Client) -> None:
    schedule = add(client)
    with pytest.raises(InputError, match="reserved for schedules"):
        client.start_run(GRAPH, run_id=tick_run_id(schedule, schedule.next_at))
    assert runs_of(client) == []


def test_schedules_that_stay_due_do_not_hold_back_the_others(client: Client,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """More queued or failing schedules at the head of the due list than one page holds: a pass
    pages past them, and a zone this machine lacks pauses its schedule with the reason."""
    monkeypatch.setattr(schedules_module, "DUE_PER_PASS", 2)
    blocked = [add(client, f"blocked-{n}", cron="0 * * * *", overlap="queue") for n in range(3)]
    tick = blocked[0].next_at
    fire_due(client.runtime, tick)  # each starts a run that never ends (no worker)
    with client.runtime.journal.engine.begin() as conn:
        conn.execute(schedules.update().where(schedules.c.name == "blocked-2").values(timezone="Atlantis/Lost"))
    add(client, "late", cron="* * * * *")
    when = tick + timedelta(hours=1, minutes=1)  # after the three at the head of the due list
    with client.runtime.journal.engine.begin() as conn:
        conn.execute(schedules.update().where(schedules.c.name == "late").values(next_at=when))
    late = client.runtime.journal.schedules.get("acme", "late")
    report = fire_due(client.runtime, when)
    assert report.started == [tick_run_id(late, when)]
    assert "unknown time zone" in report.failed["blocked-2"]
    lost = client.runtime.journal.schedules.get("acme", "blocked-2")
    assert lost.paused and "Atlantis/Lost" in (lost.last_error or "")
    assert [client.runtime.journal.schedules.get("acme", f"blocked-{n}").next_at for n in range(2)] == [
        tick + timedelta(hours=1)] * 2  # still due, waiting for their runs
