"""How a failure is journaled, in one shape for every step and run that fails:
`{type, message, code, class, traceback, ...}` (the message and traceback redacted, then bounded:
pal.core.redact; the class is the retry class, pal.core.retry).

The traceback is what an operator needs to act on a failed step without reproducing it; it is
bounded, keeping its end: the innermost frames and the exception line say where it failed, and the
outermost frames are PAL's own step protocol, the same every time.
A failure PAL made up rather than caught (a rejected approval, a budget) has no traceback: "".
"""

from __future__ import annotations

import traceback
from typing import Any

from pal.core.redact import redact_bounded, redact_text
from pal.core.retry import error_class
from pal.errors import StepError

MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 8000


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The redacted traceback of `exc` (its causes included), at most `limit` characters: its end,
    after a line saying how much was left out. "" for an exception that was never raised."""
    if exc.__traceback__ is None and exc.__cause__ is None and exc.__context__ is None:
        return ""
    text = redact_text("".join(traceback.format_exception(exc)))
    if len(text) <= limit:
        return text
    marker = "… ({} characters of the traceback left out)\n"
    keep = limit - len(marker.format(len(text)))
    # Cut at a line's start, so the first line kept is whole.
    tail = text[len(text) - keep:]
    tail = tail[tail.find("\n") + 1:] if "\n" in tail[:-1] else tail
    return marker.format(len(text) - len(tail)) + tail


def failure_payload(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """The journal's record of `exc`; `extra` adds what the failure is about (a child run's id)."""
    return {"type": type(exc).__name__, "message": redact_bounded(str(exc), MAX_MESSAGE_CHARS),
            "code": exc.code if isinstance(exc, StepError) else "step_failed",
            "class": error_class(exc), "traceback": bounded_traceback(exc), **extra}
