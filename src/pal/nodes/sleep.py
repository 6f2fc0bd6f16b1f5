"""`sleep`: wait for a time (`duration`, e.g. "72h") or until one (`until`, an ISO 8601 time with its
offset), holding no worker, no lease and no message.

The step journals `timer_set {due_at}` and `step_waiting {kind: "timer", due_at}`, and the run parks.
The orphan sweep wakes it (every PAL_RECOVERY_INTERVAL, so within one interval of its time): it
journals `timer_fired {due_at, fired_at}` and completes the step with `{"due_at", "fired_at"}`, once,
whoever else wakes it too. A time already past completes the step at once. Both fields may be
templates (`"{{ input.wait }}"`); a rendered value that is not a time fails the step `sleep_invalid`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pal.core import templates
from pal.core.durations import parse_go_duration
from pal.core.vocabulary import EventKind
from pal.errors import StepError
from pal.nodes.base import Field, NodeKind, Park, StepContext

MAX_SLEEP = timedelta(days=400)  # past a year and a month: a schedule's job, not a run's
WAIT_KIND = "timer"


class SleepInvalid(StepError):
    """A sleep's rendered `duration` or `until` is not a time it can wait for."""

    code = "sleep_invalid"


class Sleep(NodeKind):
    type_name = "sleep"
    fields: ClassVar[Mapping[str, Field]] = {
        "duration": Field((str,)),
        "until": Field((str,)),
    }

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        given = [key for key in ("duration", "until") if key in data]
        if len(given) != 1:
            problems.append("a sleep needs exactly one of duration (e.g. \"30m\") or until "
                            "(an ISO 8601 time)")
            return problems
        value = data[given[0]]
        if isinstance(value, str) and not templates.has_template(value):
            problem = _problem(given[0], value)
            if problem:
                problems.append(problem)
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        key = "duration" if "duration" in data else "until"
        rendered = ctx.render(data[key])
        now = ctx.now()
        problem = _problem(key, rendered) if isinstance(rendered, str) else f"{key} rendered to a non-string"
        if problem:
            raise SleepInvalid(problem)
        if key == "duration":
            due = now + timedelta(seconds=parse_go_duration(rendered))
        else:
            due = _instant(rendered)
        if due - now > MAX_SLEEP:
            raise SleepInvalid(f"until {rendered!r} is more than {MAX_SLEEP.days} days away")
        if due <= now:
            return {"due_at": due.isoformat(), "fired_at": now.isoformat()}
        payload = {"kind": WAIT_KIND, "due_at": due.isoformat(), "set_at": now.isoformat()}
        return Park(payload, due, event=(EventKind.TIMER_SET, {"due_at": due.isoformat()}))


def _problem(key: str, value: str) -> str | None:
    """Why `value` is not a time to sleep for (`duration`) or until (`until`); None if it is."""
    if len(value) > 64:
        return f"{key} is longer than 64 characters"
    if key == "duration":
        try:
            seconds = parse_go_duration(value)
        except ValueError:
            return f"duration {value!r} is not a duration (examples: 90s, 30m, 72h)"
        if seconds <= 0:
            return f"duration {value!r} must be positive"
        if seconds > MAX_SLEEP.total_seconds():
            return f"duration {value!r} is more than {MAX_SLEEP.days} days"
        return None
    try:
        _instant(value)
    except ValueError as exc:
        return str(exc)
    return None


def _instant(value: str) -> datetime:
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"until {value!r} is not an ISO 8601 time "
                         "(e.g. 2027-01-31T09:00:00+01:00)") from None
    if instant.tzinfo is None:
        raise ValueError(f"until {value!r} has no offset: say which time zone (+00:00, Z, ...)")
    return instant
