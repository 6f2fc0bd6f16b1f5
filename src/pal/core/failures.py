"""How a failure is journaled, in one shape for every step and run that fails:
`{type, message, code, class, ...}` (the message redacted: pal.core.redact; the class is the retry
class, pal.core.retry)."""

from __future__ import annotations

from typing import Any

from pal.core.redact import redact_text
from pal.core.retry import error_class
from pal.errors import StepError

MAX_MESSAGE_CHARS = 4000


def failure_payload(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """The journal's record of `exc`; `extra` adds what the failure is about (a child run's id)."""
    return {"type": type(exc).__name__, "message": redact_text(str(exc)[:MAX_MESSAGE_CHARS]),
            "code": exc.code if isinstance(exc, StepError) else "step_failed",
            "class": error_class(exc), **extra}
