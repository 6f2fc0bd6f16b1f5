"""The runs list's filters (docs/api.md, GET /v1/runs): status, the graph's name (read from the plan
snapshot's JSON), text in the run id, a creation-time range; a stable newest-first order that pages
without overlap; on SQLite and on Postgres."""

from __future__ import annotations

from typing import Any

from pal.core.vocabulary import RunStatus
from pal.storage.journal import Journal
from tests.storage.kit import TTL, at


def make(journal: Journal, run_id: str, seconds: float, graph: Any, tenant: str = "t1") -> None:
    _, created = journal.runs.create_run(run_id=run_id, tenant_id=tenant, kind="graph", graph=graph,
                                         graph_hash=None, run_input=None, now=at(seconds), lease_ttl=TTL)
    assert created


def ids(journal: Journal, **filters: Any) -> list[str]:
    return [r.id for r in journal.runs.list_runs(tenant_id="t1", **filters)]


def seed(journal: Journal) -> None:
    make(journal, "refund-1", 0, {"name": "refunds", "nodes": []})
    make(journal, "refund-2", 10, {"name": "refunds", "nodes": []})
    make(journal, "Report-A", 20, {"name": "reports", "nodes": []})
    make(journal, "nameless", 30, {"nodes": []})
    make(journal, "odd_%", 40, {"name": "x%", "nodes": []})
    make(journal, "theirs-refund", 25, {"name": "refunds", "nodes": []}, tenant="t2")


def test_each_filter_narrows_the_tenants_runs(journal: Journal) -> None:
    seed(journal)
    assert ids(journal) == ["odd_%", "nameless", "Report-A", "refund-2", "refund-1"]
    assert ids(journal, graph="refunds") == ["refund-2", "refund-1"]  # never the other tenant's
    assert ids(journal, graph="refund") == [] and ids(journal, graph="x%") == ["odd_%"]  # exact name
    assert ids(journal, search="REFUND") == ["refund-2", "refund-1"]  # any case
    assert ids(journal, search="report") == ["Report-A"]
    # LIKE's wildcards are text, not patterns: "%" and "_" match only themselves.
    assert ids(journal, search="%") == ["odd_%"] and ids(journal, search="d_") == ["odd_%"]
    assert ids(journal, since=at(10), until=at(30)) == ["Report-A", "refund-2"]  # since in, until out
    assert ids(journal, since=at(31)) == ["odd_%"] and ids(journal, until=at(0)) == []
    assert ids(journal, status=RunStatus.QUEUED, graph="refunds", search="2", since=at(5)) == ["refund-2"]
    assert ids(journal, status=RunStatus.SUCCEEDED) == []
    names = {r.id: r.graph_name for r in journal.runs.list_runs(tenant_id="t1")}
    assert names["refund-1"] == "refunds" and names["nameless"] is None


def test_pages_follow_a_stable_order_even_for_runs_created_at_the_same_time(journal: Journal) -> None:
    for name in ("c", "a", "b", "d", "e"):
        make(journal, name, 0, {"nodes": []})  # one creation time: the id breaks the tie
    pages = [ids(journal, limit=2, offset=offset) for offset in (0, 2, 4)]
    assert pages == [["a", "b"], ["c", "d"], ["e"]]
