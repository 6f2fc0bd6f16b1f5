"""Schedules: a graph started on a cron by celery beat (`pal.fire_schedules`, every
PAL_RECOVERY_INTERVAL). Each tick's run has an id derived from the schedule and the tick, and the
schedule's `next_at` moves on by compare-and-set from the value read, so any number of beats start
one run per tick. `overlap` says what a tick does while the schedule's previous run is in flight:
`skip` it, `queue` it until that run ends, or `cancel` that run and start. After downtime, one run
for the missed ticks, or with `catch_up` one per tick."""

from __future__ import annotations

import hashlib
import logging
import re
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from pal.core.clock import utcnow
from pal.core.cron import Cron, CronError, parse_cron, parse_zone
from pal.core.records import Schedule
from pal.core.vocabulary import TERMINAL_STATUSES
from pal.engine.runs import SCHEDULE_PREFIX, cancel, check_run_input, start_scheduled_run
from pal.engine.runtime import Runtime
from pal.errors import BrokerUnavailable, GraphError, InputError, Refused, RunNotFound

log = logging.getLogger(__name__)

OVERLAPS = ("skip", "queue", "cancel")
MAX_SCHEDULES = 1_000  # per tenant
DUE_PER_PASS = 200  # due schedules read at once
MAX_PAGES = 50  # pages one pass fires (10,000 schedules); the rest are due at the next
CATCH_UP_PER_PASS = 100  # missed ticks one schedule fires in one pass when catching up
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


@dataclass
class FiringReport:
    started: list[str] = field(default_factory=list)  # run ids
    skipped: list[str] = field(default_factory=list)  # schedule names whose tick was skipped
    failed: dict[str, str] = field(default_factory=dict)  # schedule name -> why its tick started nothing


def add_schedule(rt: Runtime, *, tenant_id: str, name: Any, cron: Any, graph: Any, run_input: Any = None,
                 timezone: Any = "UTC", overlap: Any = "skip", catch_up: Any = False) -> Schedule:
    """Validate everything, then add the schedule; its first tick is the cron's next time. InputError
    (or GraphError) with nothing written for a bad name, cron, zone, overlap, graph or input; Refused
    for a name the tenant uses, or past MAX_SCHEDULES."""
    if not isinstance(name, str) or not SCHEDULE_NAME.match(name):
        raise InputError("a schedule's name is 1 to 64 letters, digits and _ . : -, starting with a letter "
                         "or digit")
    if overlap not in OVERLAPS:
        raise InputError(f"overlap is one of {', '.join(OVERLAPS)}")
    if not isinstance(catch_up, bool):
        raise InputError("catch_up is true or false")
    try:
        zone, parsed = parse_zone(timezone), parse_cron(cron)
    except CronError as exc:
        raise InputError(str(exc)) from None
    run_input = check_run_input(run_input, rt.settings.max_input_bytes, rt.settings.max_json_depth)
    plan = rt.validated_plan(graph)
    now = utcnow()
    return rt.journal.schedules.add(values={
        "tenant_id": tenant_id, "name": name, "cron": cron, "timezone": timezone, "graph": plan.document,
        "input": run_input, "overlap": overlap, "catch_up": catch_up, "next_at": parsed.next_after(now, zone),
        "created_at": now}, max_per_tenant=MAX_SCHEDULES)


def list_schedules(rt: Runtime, tenant_id: str) -> list[Schedule]:
    return rt.journal.schedules.of_tenant(tenant_id)


def get_schedule(rt: Runtime, tenant_id: str, name: str) -> Schedule:
    """ScheduleNotFound when the tenant has none of that name."""
    return rt.journal.schedules.get(tenant_id, name)


def delete_schedule(rt: Runtime, tenant_id: str, name: str) -> None:
    """Delete it (the runs it started stay); ScheduleNotFound when the tenant has none of that name."""
    rt.journal.schedules.delete(tenant_id, name)


def pause(rt: Runtime, tenant_id: str, name: str) -> Schedule:
    return rt.journal.schedules.set_paused(tenant_id, name, paused=True)


def resume(rt: Runtime, tenant_id: str, name: str) -> Schedule:
    """Unpause from the cron's next time after now: the ticks of the pause are not run."""
    schedule = rt.journal.schedules.get(tenant_id, name)
    next_at = parse_cron(schedule.cron).next_after(utcnow(), parse_zone(schedule.timezone))
    return rt.journal.schedules.set_paused(tenant_id, name, paused=False, next_at=next_at)


def tick_run_id(schedule: Schedule, tick: datetime) -> str:
    """The id of the run a tick starts: the same for every beat, new for a schedule added again."""
    seed = f"{schedule.tenant_id}|{schedule.name}|{schedule.created_at.isoformat()}|{tick.isoformat()}"
    return SCHEDULE_PREFIX + hashlib.sha256(seed.encode()).hexdigest()[:40]


def fire_due(rt: Runtime, now: datetime | None = None) -> FiringReport:
    """One pass: start the runs of every due tick (celery beat's `pal.fire_schedules`), a page of
    DUE_PER_PASS schedules at a time, up to MAX_PAGES pages. One schedule's failure is its own."""
    now = now or utcnow()
    report = FiringReport()
    after: tuple[datetime, str, str] | None = None
    for _ in range(MAX_PAGES):
        page = rt.journal.schedules.due(now=now, limit=DUE_PER_PASS, after=after)
        for schedule in page:
            try:
                _fire(rt, schedule, now, report)
            except Exception as exc:  # a database hiccup: the tick stays due for the next pass
                log.warning("schedule %s of %s not fired: %s", schedule.name, schedule.tenant_id, exc)
                report.failed[schedule.name] = str(exc)
        if len(page) < DUE_PER_PASS:
            break
        after = (page[-1].next_at, page[-1].tenant_id, page[-1].name)
    return report


def _fire(rt: Runtime, schedule: Schedule, now: datetime, report: FiringReport) -> None:
    try:
        cron, zone = parse_cron(schedule.cron), parse_zone(schedule.timezone)
    except CronError as exc:  # a zone the API host knew and this worker's tz database lacks
        rt.journal.schedules.stop(schedule, error=f"paused: {exc}")
        report.failed[schedule.name] = str(exc)
        return
    started_here: set[str] = set()  # a catch-up's own runs do not count as overlapping its next tick
    for _ in range(CATCH_UP_PER_PASS if schedule.catch_up else 1):
        if schedule.last_run_id not in started_here and _in_flight(rt, schedule.last_run_id):
            if schedule.overlap == "queue":
                return  # the tick stays due until the previous run ends
            if schedule.overlap == "skip":
                next_at = _next_tick(cron, zone, schedule, now)
                if rt.journal.schedules.advance(schedule, next_at=next_at, now=now, run_id=None, error=None):
                    report.skipped.append(schedule.name)
                return
            with suppress(Refused, RunNotFound):  # it ended (or was pruned) meanwhile
                cancel(rt, str(schedule.last_run_id), by=f"schedule:{schedule.name}",
                       reason="a newer tick of its schedule (overlap: cancel)")
        run_id, error = _start(rt, schedule)
        next_at = _next_tick(cron, zone, schedule, now)
        if not rt.journal.schedules.advance(schedule, next_at=next_at, now=now, run_id=run_id, error=error):
            return  # another beat took this tick
        if run_id is not None:
            report.started.append(run_id)
            started_here.add(run_id)
        else:
            report.failed[schedule.name] = str(error)
        if next_at > now:
            return
        again = rt.journal.schedules.get(schedule.tenant_id, schedule.name)
        if again.paused or again.created_at != schedule.created_at or again.next_at > now:
            return  # paused, replaced or moved on meanwhile
        schedule = again


def _next_tick(cron: Cron, zone: ZoneInfo, schedule: Schedule, now: datetime) -> datetime:
    """The tick after this one: the next missed one when catching up, else the next after now."""
    return cron.next_after(schedule.next_at if schedule.catch_up else now, zone)


def _start(rt: Runtime, schedule: Schedule) -> tuple[str | None, str | None]:
    """Start the tick's run: its id, or None and why nothing started (the tick is then passed)."""
    run_id = tick_run_id(schedule, schedule.next_at)
    try:
        start_scheduled_run(rt, schedule.graph, schedule.input, run_id=run_id, tenant_id=schedule.tenant_id)
    except BrokerUnavailable:
        return run_id, None  # journaled: the orphan sweep sends its first step
    except Refused as exc:  # the tenant's quota; or the tick's id pruned already: not started again
        log.warning("schedule %s of %s: tick %s started nothing: %s", schedule.name, schedule.tenant_id,
                    schedule.next_at.isoformat(), exc)
        return None, str(exc)
    except (GraphError, InputError) as exc:  # the stored graph no longer validates (a tool unregistered)
        log.error("schedule %s of %s: tick %s started nothing: %s", schedule.name, schedule.tenant_id,
                  schedule.next_at.isoformat(), exc)
        return None, str(exc)[:2000]
    return run_id, None


def _in_flight(rt: Runtime, run_id: str | None) -> bool:
    if run_id is None:
        return False
    try:
        return rt.journal.runs.get_run(run_id).status not in TERMINAL_STATUSES
    except RunNotFound:
        return False
