"""A start's key: `dedupe_key` (a second start with the key within its window returns the first run)
or `debounce_key` (a start supersedes the run its burst queued before it; the last runs once the
burst has been quiet for the period). Checked here, before anything is written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pal.core.durations import parse_go_duration
from pal.errors import InputError

DEDUPE, DEBOUNCE = "dedupe", "debounce"
DEFAULT_DEDUPE_WINDOW = 86_400.0  # a day, as the providers' idempotency keys
MAX_DEDUPE_WINDOW = 30 * 86_400.0
MAX_DEBOUNCE = 7 * 86_400.0
_KEY = re.compile(r"[^\x00-\x1f\x7f]{1,256}\Z")


@dataclass(frozen=True)
class StartKey:
    purpose: str  # DEDUPE or DEBOUNCE
    key: str
    seconds: float  # the dedupe window, or the debounce period


def start_key(*, dedupe_key: Any = None, dedupe_window: Any = None, debounce_key: Any = None,
              debounce: Any = None) -> StartKey | None:
    """The start's key, or None; InputError for a malformed key or duration, for a window or period
    without its key (or a debounce key without its period), and for both kinds at once."""
    if dedupe_key is not None and debounce_key is not None:
        raise InputError("a start takes dedupe_key or debounce_key, not both")
    if dedupe_window is not None and dedupe_key is None:
        raise InputError("dedupe_window needs a dedupe_key")
    if debounce is not None and debounce_key is None:
        raise InputError("debounce needs a debounce_key")
    if dedupe_key is not None:
        window = DEFAULT_DEDUPE_WINDOW if dedupe_window is None else \
            _seconds(dedupe_window, "dedupe_window", MAX_DEDUPE_WINDOW)
        return StartKey(DEDUPE, _key(dedupe_key, "dedupe_key"), window)
    if debounce_key is not None:
        if debounce is None:
            raise InputError("debounce_key needs debounce, the quiet period before the last start runs")
        period = _seconds(debounce, "debounce", MAX_DEBOUNCE)
        return StartKey(DEBOUNCE, _key(debounce_key, "debounce_key"), period)
    return None


def _key(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _KEY.match(value):
        raise InputError(f"{what} must be 1 to 256 printable characters")
    return value


def _seconds(value: Any, what: str, most: float) -> float:
    """A duration ("90s", "2h") or a number of seconds, from 1 second to `most`."""
    try:
        if isinstance(value, str) and len(value) <= 32:
            seconds = parse_go_duration(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise ValueError(value)
    except ValueError:
        raise InputError(f"{what} must be a duration such as \"30s\" or \"2h\", or seconds") from None
    if not 1.0 <= seconds <= most:  # NaN fails too
        raise InputError(f"{what} must be from 1s to {most / 86_400:g} days")
    return seconds
