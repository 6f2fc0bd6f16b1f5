"""The runs list's filters, checked in one place for REST (GET /v1/runs), the dashboard's runs page
and `pal runs list`: a status, the graph's name, text in the run id and a creation-time range
(docs/api.md). Pure: it parses and bounds what a caller typed and raises ValueError naming the
problem; the journal applies the result (RunStore.list_runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from pal.core.vocabulary import ALL_STATUSES

MAX_GRAPH_CHARS = 200  # a graph's name is at most this long (pal.plan.graph)
MAX_SEARCH_CHARS = 128  # a run id is at most 128 characters
MAX_TIME_CHARS = 40
MAX_OFFSET = 1_000_000


@dataclass(frozen=True)
class RunFilter:
    status: str | None = None
    graph: str | None = None
    search: str | None = None
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of RunStore.list_runs."""
        return asdict(self)

    def as_query(self) -> dict[str, str]:
        """The filter as query parameters (the dashboard's page links keep it)."""
        values = {"status": self.status, "graph": self.graph, "search": self.search,
                  "since": self.since.isoformat() if self.since else None,
                  "until": self.until.isoformat() if self.until else None}
        return {key: value for key, value in values.items() if value}


def parse_time(text: str, name: str) -> datetime:
    """An ISO 8601 date or time (`2025-01-31`, `2025-01-31T12:00`, with an offset or `Z`); a time
    without a zone is UTC."""
    if len(text) > MAX_TIME_CHARS:
        raise ValueError(f"{name} is longer than {MAX_TIME_CHARS} characters")
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an ISO 8601 date or time, like 2025-01-31 or "
                         f"2025-01-31T12:00:00Z, not {text[:MAX_TIME_CHARS]!r}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def run_filter(*, status: str | None = None, graph: str | None = None, search: str | None = None,
               since: str | datetime | None = None, until: str | datetime | None = None) -> RunFilter:
    """The filter of what a caller gave (empty strings mean no filter); ValueError when a value is
    unknown, malformed or too long."""
    status, graph, search = status or None, graph or None, search or None
    if status is not None and status not in ALL_STATUSES:
        raise ValueError(f"unknown status {status[:32]!r} (one of: {', '.join(ALL_STATUSES)})")
    if graph is not None and len(graph) > MAX_GRAPH_CHARS:
        raise ValueError(f"graph is longer than {MAX_GRAPH_CHARS} characters")
    if search is not None and len(search) > MAX_SEARCH_CHARS:
        raise ValueError(f"search is longer than {MAX_SEARCH_CHARS} characters")
    times = [_time(since, "since"), _time(until, "until")]
    if times[0] and times[1] and times[0] >= times[1]:
        raise ValueError("since must be before until")
    return RunFilter(status, graph, search, *times)


def _time(value: str | datetime | None, name: str) -> datetime | None:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return parse_time(value, name) if value else None
