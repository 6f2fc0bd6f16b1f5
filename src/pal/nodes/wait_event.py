"""`wait_event`: wait for a signal sent to the run (`POST /v1/runs/{id}/signals/{name}`, `pal runs
signal`, `Client.signal`, the `pal.signal` task), holding no worker.

The step journals `step_waiting {kind: "event", name, match, expires_at?}` and the run parks. The
oldest signal of that `name` whose payload holds every key of `match` with its value completes the
step with `{"branch": "received", "signal": {id, name, payload, sent_by, sent_at}}` and journals
`signal_received`; a signal sent before the wait is kept for it. Each signal wakes one wait, each wait
takes one signal. With `expiresIn` (a duration), the sweep takes the `timeout` edge once it lapses,
or fails the run `event_timeout` when the graph has none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pal.errors import StepError
from pal.nodes.base import Field, NodeKind, Park, StepContext, expiry, expiry_problems

BRANCHES = ("received", "timeout")
WAIT_KIND = "event"
SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")
NAME_RULE = "1 to 64 letters, digits and _ . : -, starting with a letter or digit"


class EventNameInvalid(StepError):
    """A wait_event's rendered `name` or `match` is not one it can wait for."""

    code = "event_name_invalid"


class WaitEvent(NodeKind):
    type_name = "wait_event"
    fields: ClassVar[Mapping[str, Field]] = {
        "name": Field((str,), required=True),
        "match": Field((dict,)),
        "expiresIn": Field((str,), templated=False),
    }
    branches: ClassVar[tuple[str, ...]] = BRANCHES

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        name = data.get("name")
        if isinstance(name, str) and "{{" not in name and not SIGNAL_NAME.match(name):
            problems.append(f"name {name[:80]!r} must be {NAME_RULE}")
        return [*problems, *expiry_problems(data)]

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        name = ctx.render(data["name"])
        if not isinstance(name, str) or not SIGNAL_NAME.match(name):
            raise EventNameInvalid(f"the event name rendered to {str(name)[:80]!r}; it must be {NAME_RULE}")
        match = ctx.render(data.get("match") or {})
        if not isinstance(match, dict):
            raise EventNameInvalid("match rendered to something other than an object")
        now = ctx.now()
        payload: dict[str, Any] = {"kind": WAIT_KIND, "name": name, "match": match,
                                   "requested_at": now.isoformat()}
        wake_at = expiry(data, now)
        if wake_at is not None:
            payload["expires_at"] = wake_at.isoformat()
        return Park(payload, wake_at)

