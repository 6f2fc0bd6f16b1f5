"""Go-style durations ("30s", "1m30s", "500ms", "2h") parsed to seconds."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Return the duration in seconds; raise ValueError when `text` is not a Go duration.

    Like Go's time.ParseDuration: a sign, then one or more number+unit parts; "0" alone is zero.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"invalid duration {text!r}")
    return sign * total
