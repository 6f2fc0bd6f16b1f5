"""Cron expressions: their next times in a time zone (clock changes included), the Vixie rule for
two restricted day fields, and the refusals of hostile or impossible expressions and zones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pal.core.cron import CronError, parse_cron, parse_zone


def times(cron: str, zone: str, start: datetime, count: int) -> list[str]:
    parsed, tz, found, at = parse_cron(cron), parse_zone(zone), [], start
    for _ in range(count):
        at = parsed.next_after(at, tz)
        found.append(at.astimezone(tz).strftime("%a %Y-%m-%d %H:%M %z"))
    return found


def test_weekdays_at_nine_in_paris() -> None:
    assert times("0 9 * * 1-5", "Europe/Paris", datetime(2026, 12, 4, 9, tzinfo=UTC), 3) == [
        "Mon 2026-12-07 09:00 +0100", "Tue 2026-12-08 09:00 +0100", "Wed 2026-12-09 09:00 +0100"]


def test_steps_lists_names_and_aliases() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert times("*/20 * * * *", "UTC", start, 3) == [
        "Thu 2026-01-01 00:20 +0000", "Thu 2026-01-01 00:40 +0000", "Thu 2026-01-01 01:00 +0000"]
    assert times("15 10 * jan,mar sun", "UTC", start, 2) == [
        "Sun 2026-01-04 10:15 +0000", "Sun 2026-01-11 10:15 +0000"]
    assert times("0 0 * * 7", "UTC", start, 1) == times("0 0 * * 0", "UTC", start, 1)
    assert times("@monthly", "UTC", start, 2) == ["Sun 2026-02-01 00:00 +0000", "Sun 2026-03-01 00:00 +0000"]


def test_two_restricted_day_fields_run_on_either() -> None:
    # The 13th of the month or any Friday (Vixie cron), not Fridays the 13th only.
    assert times("0 12 13 * fri", "UTC", datetime(2026, 2, 1, tzinfo=UTC), 4) == [
        "Fri 2026-02-06 12:00 +0000", "Fri 2026-02-13 12:00 +0000", "Fri 2026-02-20 12:00 +0000",
        "Fri 2026-02-27 12:00 +0000"]
    assert times("0 0 29 2 *", "UTC", datetime(2026, 1, 1, tzinfo=UTC), 1) == ["Tue 2028-02-29 00:00 +0000"]
    # A day field that starts with `*` is unrestricted, as Vixie reads it: odd days that are Mondays.
    assert times("0 0 */2 * mon", "UTC", datetime(2026, 2, 1, tzinfo=UTC), 3) == [
        "Mon 2026-02-09 00:00 +0000", "Mon 2026-02-23 00:00 +0000", "Mon 2026-03-09 00:00 +0000"]


def test_clock_changes_run_a_skipped_time_after_and_a_repeated_one_once() -> None:
    assert times("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC), 2) == [
        "Sun 2026-03-08 03:30 -0400", "Mon 2026-03-09 02:30 -0400"]
    assert times("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC), 3) == [
        "Sun 2026-11-01 01:30 -0400", "Mon 2026-11-02 01:30 -0500", "Tue 2026-11-03 01:30 -0500"]


@pytest.mark.parametrize("cron, says", [
    ("", "1 to 128 characters"), ("* " * 70, "1 to 128 characters"), (None, "1 to 128 characters"),
    ("* * * *", "five fields"), ("* * * * * *", "five fields"), ("@reboot", "five fields"),
    ("60 * * * *", "outside 0-59"), ("* 24 * * *", "outside 0-23"), ("* * 0 * *", "outside 1-31"),
    ("* * * 13 *", "outside 1-12"), ("* * * * 8", "outside 0-7"), ("5-1 * * * *", "runs backwards"),
    ("*/0 * * * *", "step must be at least 1"), ("-1 * * * *", "is not a number"),
    ("1,,2 * * * *", "is not a number"), ("0 0 * foo *", "or a name"), ("999 * * * *", "is not a number"),
    ("0 0 30 2 *", "does not run within five years"), ("0 0 31 4,6,9,11 *", "does not run within five years"),
])
def test_bad_crons_are_refused(cron: object, says: str) -> None:
    with pytest.raises(CronError) as info:
        parse_cron(cron)
    assert says in str(info.value)


@pytest.mark.parametrize("zone", ["", "Mars/Olympus", "../../etc/passwd", "Europe/../etc", "/etc/localtime",
                                  "a" * 200, 5, "Europe/Paris\x00"])
def test_bad_zones_are_refused(zone: object) -> None:
    with pytest.raises(CronError):
        parse_zone(zone)
