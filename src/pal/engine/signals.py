"""Signals: what the world tells a run (a payment arrived, a user replied). A signal is kept for the
run until one of its `wait_event` steps takes it (pal.nodes.wait_event); a run waiting for it is
woken at once, else the next such wait takes it. Every way in (REST, CLI, pal.Client, the
`pal.signal` task) comes here."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from pal.core.clock import utcnow
from pal.engine.runs import cancel, check_run_input
from pal.engine.runtime import Runtime
from pal.engine.waiting import wake_quietly
from pal.errors import InputError, Refused
from pal.nodes.wait_event import NAME_RULE, SIGNAL_NAME

MAX_SIGNAL_BYTES = 65_536  # one signal's payload, as JSON
MAX_PENDING_SIGNALS = 1_000  # signals one run may hold that no step has taken
_SENDER = re.compile(r"[^\x00-\x1f\x7f]{1,256}\Z")


def send_signal(rt: Runtime, run_id: str, name: str, payload: Any = None, *, tenant_id: str,
                by: str) -> str:
    """Keep signal `name` with `payload` for run `run_id` of tenant `tenant_id` and wake the run
    if it waits, or cancel the run (and its child runs) when the graph's `cancelOn` names the
    signal; the signal's id. InputError (nothing written) for a bad name, sender or payload;
    RunNotFound for a run of another tenant; Refused for a finished run or one holding
    MAX_PENDING_SIGNALS signals already."""
    if not isinstance(name, str) or not SIGNAL_NAME.match(name):
        raise InputError(f"a signal's name must be {NAME_RULE}; nothing was sent")
    if not isinstance(by, str) or not _SENDER.match(by):
        raise InputError("who sends a signal is 1 to 256 printable characters; nothing was sent")
    payload = check_run_input(payload, MAX_SIGNAL_BYTES, rt.settings.max_json_depth,
                              what="a signal's payload", limit="64 KiB per signal")
    signal_id = rt.journal.signals.send(run_id=run_id, tenant_id=tenant_id, name=name, payload=payload,
                                        sent_by=by, now=utcnow(), max_pending=MAX_PENDING_SIGNALS)
    run = rt.journal.runs.get_run(run_id, tenant_id)
    if isinstance(run.graph, dict) and name in (run.graph.get("cancelOn") or ()):
        # Refused: the run finished between the signal and its cancellation; the signal is kept.
        with contextlib.suppress(Refused):
            cancel(rt, run_id, by=f"signal:{name}",
                   reason=f"signal {name!r} from {by} (the graph's cancelOn)")
        return signal_id
    wake_quietly(rt, run_id)  # a step waiting for it takes it now; else the sweep's next look
    return signal_id
