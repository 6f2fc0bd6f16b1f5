"""Cron expressions (five fields: minute hour day-of-month month day-of-week, or @hourly, @daily,
@weekly, @monthly, @yearly) and their next time in a time zone.

Fields take `*`, numbers, ranges `a-b`, steps `*/n` or `a-b/n`, and lists joined by commas; months
and weekdays also take English names (jan, mon); weekday 0 and 7 are Sunday. When both day fields
are restricted (neither starts with `*`) a day matching either runs, as in Vixie cron. A local time
that a clock change skips runs at the same wall-clock reading after the change; one that repeats
runs once, the first."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MAX_CRON_CHARS = 128
HORIZON_DAYS = 5 * 366 + 1  # a schedule must run within five years (30 February never does)
_ZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{0,31}(/[A-Za-z0-9_+-]{1,32}){0,2}\Z")
_ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
           ("month", 1, 12, _MONTHS), ("day of week", 0, 7, _DAYS))


class CronError(ValueError):
    """A cron expression or time zone that cannot be scheduled; the message says why."""


@dataclass(frozen=True)
class Cron:
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 Monday .. 6 Sunday, as date.weekday()
    any_day: bool  # day of month starts with `*` (`*`, `*/2`): unrestricted, as Vixie cron reads it
    any_weekday: bool  # day of week starts with `*`

    def runs_on(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date, by_weekday = day.day in self.days, day.weekday() in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday

    def next_after(self, after: datetime, zone: ZoneInfo) -> datetime:
        """The first time strictly after `after` (aware) that this runs in `zone`, in UTC."""
        local = after.astimezone(zone)
        day = local.date()
        for _ in range(HORIZON_DAYS):
            if self.runs_on(day):
                for hour in self.hours:
                    for minute in self.minutes:
                        wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                        moment = wall.astimezone(UTC)
                        if moment > after:
                            return moment
            day += timedelta(days=1)
        raise CronError("the schedule does not run within five years")


def parse_cron(text: object) -> Cron:
    """The Cron of `text`; CronError naming the field at fault."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_CRON_CHARS:
        raise CronError(f"a cron expression is a string of 1 to {MAX_CRON_CHARS} characters")
    fields = _ALIASES.get(text.strip().lower(), text).split()
    if len(fields) != 5:
        raise CronError("a cron expression has five fields (minute hour day-of-month month day-of-week) "
                        "or is one of " + ", ".join(_ALIASES))
    values = [_field(raw, *spec) for raw, spec in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset((d - 1) % 7 for d in values[4])  # cron's 0 (and 7) is Sunday; weekday() 6
    cron = Cron(minutes=tuple(sorted(values[0])), hours=tuple(sorted(values[1])), days=frozenset(values[2]),
                months=frozenset(values[3]), weekdays=weekdays, any_day=fields[2].startswith("*"),
                any_weekday=fields[4].startswith("*"))
    cron.next_after(datetime(2000, 1, 1, tzinfo=UTC), ZoneInfo("UTC"))  # never runs: CronError
    return cron


def parse_zone(name: object) -> ZoneInfo:
    """The IANA time zone `name` ("Europe/Paris", "UTC"); CronError for anything else."""
    if not isinstance(name, str) or not _ZONE.match(name) or ".." in name:
        raise CronError("a time zone is an IANA name such as \"UTC\" or \"Europe/Paris\"")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name!r}") from None


def _field(raw: str, what: str, low: int, high: int, names: Sequence[str]) -> set[int]:
    chosen: set[int] = set()
    for part in raw.lower().split(","):
        base, _, step_text = part.partition("/")
        step = _number(step_text, what, names=()) if step_text else 1
        if step < 1:
            raise CronError(f"{what}: a step must be at least 1")
        if base == "*":
            first, last = low, high
        else:
            start, dash, end = base.partition("-")
            first = _number(start, what, names, offset=low if names else 0)
            last = _number(end, what, names, offset=low if names else 0) if dash else \
                (high if step_text else first)
        if not low <= first <= last <= high:
            raise CronError(f"{what}: {part!r} is outside {low}-{high} or runs backwards")
        chosen.update(range(first, last + 1, step))
    return chosen


def _number(text: str, what: str, names: Sequence[str], offset: int = 0) -> int:
    if text in names:
        return names.index(text) + offset
    if not text.isdigit() or len(text) > 2:
        named = f" or a name ({', '.join(names)})" if names else ""
        raise CronError(f"{what}: {text!r} is not a number{named}")
    return int(text)
