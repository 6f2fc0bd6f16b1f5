"""`pal runs prune --finished-before` (pal.engine.retention.parse_cutoff): the forms it reads, in
UTC, and a clear refusal of anything else (docs/retention.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pal.engine.retention import check_batch, parse_cutoff
from pal.errors import InputError

NOW = datetime(2030, 6, 15, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "instant"), [
    ("2030-01-31", datetime(2030, 1, 31, tzinfo=UTC)),
    ("2030-01-31T12:30:00", datetime(2030, 1, 31, 12, 30, tzinfo=UTC)),
    ("2030-01-31T12:30:00Z", datetime(2030, 1, 31, 12, 30, tzinfo=UTC)),
    ("2030-01-31T12:30:00+02:00", datetime(2030, 1, 31, 10, 30, tzinfo=UTC)),
    (" 2030-01-31 ", datetime(2030, 1, 31, tzinfo=UTC)),
    ("30d", NOW - timedelta(days=30)),
    ("12h", NOW - timedelta(hours=12)),
    ("0d", NOW),
    ("9999-12-31", datetime(9999, 12, 31, tzinfo=UTC)),
])
def test_the_cutoff_forms(text: str, instant: datetime) -> None:
    parsed = parse_cutoff(text, NOW)
    assert parsed == instant and parsed.tzinfo == UTC


@pytest.mark.parametrize("text", ["", "   ", "yesterday", "30", "30x", "-30d", "1e9d", "9999999d", "999999d",
                                  "2030-02-30", "2030-01-31T25:00", "x" * 10_000, "2030-01-31\x00"])
def test_anything_else_is_refused_with_the_forms_named(text: str) -> None:
    with pytest.raises(InputError, match="ISO 8601 date"):
        parse_cutoff(text, NOW)


@pytest.mark.parametrize("batch", [0, -1, 10_001, 2**64])
def test_a_batch_out_of_bounds_is_refused(batch: int) -> None:
    with pytest.raises(InputError, match="between 1 and 10000"):
        check_batch(batch)
