"""The step functions (pal/storage/sql/functions.sql) answer a typed outcome, never a marker row.

Each answers exactly one row: an `outcome` word that pal.storage.base.Outcome names, beside the
events it read (every one a real journal event, seq > 0) or the seq it wrote. Driven here into
each outcome on a real Postgres schema; a function that answered an outcome as a row among its
events (as a negative seq) fails `test_every_step_function_answers_one_row_with_an_outcome`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pal.core.step_log import LOG_KINDS
from pal.storage.base import Outcome
from pal.storage.journal import Journal
from pal.storage.sql import functions_text
from tests.storage.kit import new_run, postgres_journal

STEP_FUNCTIONS = ("pal_fenced_log", "pal_fenced_completion", "pal_claim", "pal_complete", "pal_read_step_log")
LATER = "now() + interval '30 s'"
CALLS = {
    "claim": f"SELECT * FROM pal_claim(:run, :gen, 'w1', {LATER}, :after, :step, 1, "
             "'{\"attempt\": 1}'::jsonb, now(), true, CAST(:needs AS text[]))",
    "complete": f"SELECT * FROM pal_complete(:run, :gen, 'w1', {LATER}, :after, :step, 1, "
                "'{\"output\": 7}'::jsonb, now(), CAST(:next AS text), 1, '{\"attempt\": 1}'::jsonb)",
    "fenced_log": f"SELECT * FROM pal_fenced_log(:run, :gen, 'w1', {LATER}, :after)",
    "fenced_completion": f"SELECT * FROM pal_fenced_completion(:run, :gen, 'w1', {LATER}, :after, :step, 1, "
                         "'{\"output\": 7}'::jsonb, now())",
    "read": "SELECT * FROM pal_read_step_log(:run, :gen, :after)",
}


@pytest.fixture
def journal(pg_admin: sa.Engine) -> Iterator[Journal]:
    with postgres_journal(pg_admin) as journal:
        yield journal


def call(journal: Journal, name: str, **params: Any) -> list[dict[str, Any]]:
    """One call in a transaction of its own, committed: its rows as mappings."""
    values = {"run": "r1", "gen": 1, "after": 0, "step": "a", "needs": None, "next": None} | params
    with journal.engine.begin() as conn:
        return [dict(row) for row in conn.execute(sa.text(CALLS[name]), values).mappings()]


def answer(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The one row a step function answers, checked: a known outcome, events that are all real."""
    assert len(rows) == 1, f"a step function answered {len(rows)} rows: {rows}"
    [row] = rows
    Outcome(row["outcome"])  # an unknown word raises
    for event in row.get("events") or []:
        seq, _step, kind, _payload = event
        assert seq > 0 and kind in LOG_KINDS, f"not a journal event: {event}"
    return row


def test_every_outcome_of_the_claim_and_completion_comes_as_one_typed_row(journal: Journal) -> None:
    new_run(journal)
    assert answer(call(journal, "claim", gen=2)) == {"outcome": "refused", "events": []}
    assert answer(call(journal, "claim", needs="{z}")) == {"outcome": "refused", "events": []}
    assert answer(call(journal, "claim"))["outcome"] == "started"
    assert answer(call(journal, "claim"))["outcome"] == "duplicate"
    assert answer(call(journal, "complete", gen=2)) == {"outcome": "fenced_out", "seq": None}
    done = answer(call(journal, "complete", next="b"))
    assert done["outcome"] == "next_started" and done["seq"] > 0
    assert answer(call(journal, "complete", after=done["seq"])) == {"outcome": "already_completed", "seq": None}
    assert answer(call(journal, "complete", step="b")) == {"outcome": "log_moved", "seq": None}
    moved = answer(call(journal, "claim", step="a"))
    assert moved["outcome"] == "log_moved"
    assert [event[:3] for event in moved["events"]] == [[done["seq"], "a", "step_completed"]]
    assert answer(call(journal, "complete", step="b", after=done["seq"], next="b"))["outcome"] == "next_duplicate"


def test_every_outcome_of_the_fenced_reads_comes_as_one_typed_row(journal: Journal) -> None:
    new_run(journal)
    assert answer(call(journal, "read", gen=2)) == {"outcome": "fenced_out", "events": []}
    assert answer(call(journal, "fenced_log", gen=2)) == {"outcome": "fenced_out", "events": []}
    assert answer(call(journal, "fenced_completion", gen=2)) == {"outcome": "fenced_out", "events": []}
    completed = answer(call(journal, "fenced_completion"))
    assert completed["outcome"] == "completed" and [e[2] for e in completed["events"]] == ["step_completed"]
    assert answer(call(journal, "fenced_completion")) == {"outcome": "already_completed", "events": []}
    [(seq, step, kind, payload)] = answer(call(journal, "read"))["events"]
    assert (step, kind, payload) == ("a", "step_completed", {"output": 7})
    assert answer(call(journal, "fenced_log", after=seq)) == {"outcome": "read", "events": []}


def test_every_step_function_answers_one_row_with_an_outcome(journal: Journal) -> None:
    """From the catalogue: each step function returns one record (no set of rows in which an
    outcome could hide), whose first column is `outcome`."""
    with journal.engine.connect() as conn:
        found = {name: (returns_set, args) for name, returns_set, args in conn.execute(sa.text(
            "SELECT proname, proretset, pg_get_function_result(oid) FROM pg_proc "
            "WHERE proname = ANY(:names)"), {"names": list(STEP_FUNCTIONS)})}
    assert sorted(found) == sorted(STEP_FUNCTIONS)
    for name, (returns_set, result) in found.items():
        assert not returns_set and result == "record", f"{name} returns {result} (set: {returns_set})"
    text = functions_text()
    for name in STEP_FUNCTIONS:
        header = re.search(rf"FUNCTION {name}\((.*?)\)\n", text)
        assert header is not None and "OUT outcome text" in header.group(1), name
    assert re.search(r"SELECT\s+-\d+::bigint", text) is None, "a marker row with a negative seq"


def function_text(text: str, name: str) -> str:
    start = text.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return text[start:text.index("-- end", start)]


def test_the_log_kinds_are_written_once_in_sql_and_match_the_step_log(journal: Journal) -> None:
    text = functions_text()
    lists = re.findall(r"ARRAY\[([^\]]*)\]", text)
    assert len(lists) == 1 and "kind IN (" not in text, "the step-log kinds are written more than once"
    assert [k.strip(" '") for k in lists[0].split(",")] == [str(k) for k in LOG_KINDS]
    fence = function_text(text, "pal_fence")
    assert text.count("UPDATE run_locks") == fence.count("UPDATE run_locks"), "a fence outside pal_fence"
    assert text.count("INSERT INTO journal_events") == 1, "the once-only append is written more than once"
    new_run(journal)
    call(journal, "fenced_completion")  # writes back the claim it finds missing: a kind outside the list
    assert [e[2] for e in answer(call(journal, "read"))["events"]] == ["step_completed"]


def starts(journal: Journal, step: str) -> list[dict[str, Any]]:
    with journal.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT seq, payload FROM journal_events WHERE run_id = 'r1' AND step_id = :step "
            "AND kind = 'step_started' ORDER BY seq"), {"step": step}).mappings()]


@pytest.mark.parametrize("completion", ["complete", "fenced_completion"])
def test_a_completion_writes_back_a_lost_claim_once_and_before_itself(journal: Journal, completion: str) -> None:
    """A claim commits without waiting for its WAL: a Postgres crash or failover may lose it while
    its worker goes on. The completion writes it back (marked `restored`) before `step_completed`;
    a completion whose claim is there writes none."""
    new_run(journal)
    call(journal, completion)  # 'a' was never claimed in this journal: its claim was lost
    [restored] = starts(journal, "a")
    assert restored["payload"] == {"attempt": 1, "worker": "w1", "restored": True}
    with journal.engine.connect() as conn:
        completed = conn.execute(sa.text("SELECT seq FROM journal_events WHERE run_id = 'r1' AND step_id = 'a' "
                                         "AND kind = 'step_completed'")).scalar()
    assert restored["seq"] < completed
    assert answer(call(journal, "claim", step="b"))["outcome"] == "started"
    call(journal, completion, step="b", after=completed)
    assert [s["payload"] for s in starts(journal, "b")] == [{"attempt": 1}]  # its own claim, no other
    assert journal.doctor.violations() == []
