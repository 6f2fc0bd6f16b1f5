"""The one clock PAL reads: timezone-aware UTC. Stores take `now` as a parameter, so tests and the
recovery sweep can decide "expired" against a time of their choosing."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
