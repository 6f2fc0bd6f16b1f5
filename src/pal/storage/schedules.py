"""A tenant's cron schedules (`schedules`): added, listed, paused, resumed and deleted by name, and
the due ones advanced by compare-and-set on `next_at`, so two beats firing one tick advance it once."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pal.core.records import Schedule
from pal.errors import Refused, ScheduleNotFound
from pal.storage.base import json_safe
from pal.storage.primitives import Primitives
from pal.storage.schema import schedules


class ScheduleStore(Primitives):
    def add(self, *, values: Mapping[str, Any], max_per_tenant: int) -> Schedule:
        """Insert a schedule; Refused when the tenant has one of that name or `max_per_tenant`."""
        with self._tx() as conn:
            held = conn.execute(sa.select(sa.func.count()).select_from(schedules)
                                .where(schedules.c.tenant_id == values["tenant_id"])).scalar() or 0
            if held >= max_per_tenant:
                raise Refused(f"the tenant has {held} schedules, the most allowed ({max_per_tenant})")
            row = dict(values) | {"input": json_safe(values.get("input")), "paused": False, "skipped": 0,
                                  "last_run_id": None, "last_fired_at": None, "last_error": None}
            added = conn.execute(self._insert(schedules).values(**row).on_conflict_do_nothing()
                                 .returning(schedules.c.name)).first()
            if added is None:
                raise Refused(f"a schedule named {values['name']!r} exists; delete it first or choose "
                              "another name")
            return self._one(conn, values["tenant_id"], values["name"])

    def get(self, tenant_id: str, name: str) -> Schedule:
        with self._tx() as conn:
            return self._one(conn, tenant_id, name)

    def of_tenant(self, tenant_id: str) -> list[Schedule]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(schedules).where(schedules.c.tenant_id == tenant_id)
                                .order_by(schedules.c.name)).mappings()
            return [Schedule(**row) for row in rows]

    def set_paused(self, tenant_id: str, name: str, *, paused: bool,
                   next_at: datetime | None = None) -> Schedule:
        """Pause, or resume from `next_at`; ScheduleNotFound for a name the tenant lacks."""
        values: dict[str, Any] = {"paused": paused} | ({"next_at": next_at} if next_at is not None else {})
        with self._tx() as conn:
            changed = conn.execute(schedules.update().where(*_named(tenant_id, name)).values(**values))
            if changed.rowcount != 1:
                raise ScheduleNotFound(f"no schedule {name!r}")
            return self._one(conn, tenant_id, name)

    def delete(self, tenant_id: str, name: str) -> None:
        """Delete it (the runs it started stay); ScheduleNotFound for a name the tenant lacks."""
        with self._tx() as conn:
            if conn.execute(schedules.delete().where(*_named(tenant_id, name))).rowcount != 1:
                raise ScheduleNotFound(f"no schedule {name!r}")

    def due(self, *, now: datetime, limit: int,
            after: tuple[datetime, str, str] | None = None) -> list[Schedule]:
        """Unpaused schedules whose next tick is due, the most overdue first; `after` (the last
        one's next_at, tenant and name) pages on, so a pass visits every due schedule even when
        those at the head stay due (waiting for a run, or failing)."""
        query = sa.select(schedules).where(schedules.c.paused.is_(False), schedules.c.next_at <= now)
        if after is not None:
            query = query.where(sa.tuple_(schedules.c.next_at, schedules.c.tenant_id, schedules.c.name)
                                > sa.tuple_(*after))
        order = (schedules.c.next_at, schedules.c.tenant_id, schedules.c.name)
        with self._tx() as conn:
            return [Schedule(**row) for row in conn.execute(query.order_by(*order).limit(limit)).mappings()]

    def stop(self, schedule: Schedule, *, error: str) -> None:
        """Pause a schedule that cannot fire (its time zone unknown to this machine), keeping why."""
        with self._tx() as conn:
            conn.execute(schedules.update().where(*_named(schedule.tenant_id, schedule.name),
                                                  schedules.c.created_at == schedule.created_at)
                         .values(paused=True, last_error=error[:2000]))

    def advance(self, schedule: Schedule, *, next_at: datetime, now: datetime, run_id: str | None,
                error: str | None) -> bool:
        """Move the schedule from the tick it was read at to `next_at`, naming the tick's run (None:
        the tick was skipped) or error; False when another pass (or a pause or edit) moved it first."""
        values: dict[str, Any] = {"next_at": next_at, "last_error": error}
        if run_id is not None:
            values |= {"last_run_id": run_id, "last_fired_at": now}
        elif error is None:
            values["skipped"] = schedules.c.skipped + 1
        with self._tx() as conn:
            moved = conn.execute(schedules.update().where(
                *_named(schedule.tenant_id, schedule.name), schedules.c.next_at == schedule.next_at,
                schedules.c.created_at == schedule.created_at, schedules.c.paused.is_(False),
            ).values(**values))
            return moved.rowcount == 1

    @staticmethod
    def _one(conn: sa.Connection, tenant_id: str, name: str) -> Schedule:
        row = conn.execute(sa.select(schedules).where(*_named(tenant_id, name))).mappings().first()
        if row is None:
            raise ScheduleNotFound(f"no schedule {name!r}")
        return Schedule(**row)


def _named(tenant_id: str, name: str) -> tuple[sa.ColumnElement[bool], ...]:
    return schedules.c.tenant_id == tenant_id, schedules.c.name == name
