"""What a graph's `concurrency` and `priority`, and PAL_TENANT_CONCURRENCY / PAL_TENANT_WEIGHTS, may
be: bad values are refused when the graph is parsed or the settings load."""

from __future__ import annotations

from typing import Any

import pytest

from pal.config import load_settings
from pal.errors import ConfigError, GraphError
from pal.plan.graph import parse_graph

GRAPH = {"nodes": [{"id": "t", "type": "trigger"}, {"id": "o", "type": "output"}],
         "edges": [{"source": "t", "target": "o"}]}


def test_concurrency_and_priority_are_kept_in_the_snapshot() -> None:
    graph = parse_graph(GRAPH | {"concurrency": {"key": "{{ input.customer }}", "limit": 2}, "priority": 1})
    assert graph.document()["concurrency"] == {"key": "{{ input.customer }}", "limit": 2}
    assert graph.document()["priority"] == 1
    assert "priority" not in parse_graph(GRAPH).document()


@pytest.mark.parametrize("extra, says", [
    ({"priority": 0}, "priority must be a whole number from 1"),
    ({"priority": 6}, "priority must be a whole number from 1"),
    ({"priority": "high"}, "priority must be a whole number from 1"),
    ({"priority": True}, "priority must be a whole number from 1"),
    ({"concurrency": "customer"}, "concurrency must be an object"),
    ({"concurrency": {"key": "k", "limit": 1, "extra": 1}}, "concurrency must be an object"),
    ({"concurrency": {"limit": 1}}, "concurrency.key must be a string"),
    ({"concurrency": {"key": "x" * 257, "limit": 1}}, "concurrency.key must be a string"),
    ({"concurrency": {"key": "k", "limit": 0}}, "concurrency.limit must be a whole number"),
    ({"concurrency": {"key": "k", "limit": 1.5}}, "concurrency.limit must be a whole number"),
    ({"concurrency": {"key": "k", "limit": 10**9}}, "concurrency.limit must be a whole number"),
])
def test_a_bad_concurrency_or_priority_is_refused(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(GraphError) as info:
        parse_graph(GRAPH | extra)
    assert says in str(info.value)


def test_tenant_limits_and_weights() -> None:
    assert load_settings({}).admission.limit_of("acme") is None
    settings = load_settings({"PAL_TENANT_CONCURRENCY": "10", "PAL_TENANT_WEIGHTS": '{"acme": 4, "free": 0.05}'})
    assert [settings.admission.limit_of(t) for t in ("acme", "free", "other")] == [40, 1, 10]


@pytest.mark.parametrize("env, says", [
    ({"PAL_TENANT_CONCURRENCY": "-1"}, "from 0 (no limit)"),
    ({"PAL_TENANT_CONCURRENCY": "lots"}, "not a whole number"),
    ({"PAL_TENANT_WEIGHTS": "{nope"}, "not JSON"),
    ({"PAL_TENANT_WEIGHTS": "[1]"}, "a JSON object"),
    ({"PAL_TENANT_WEIGHTS": '{"acme": 0}'}, "weight above 0"),
    ({"PAL_TENANT_WEIGHTS": '{"acme": "4"}'}, "weight above 0"),
    ({"PAL_TENANT_WEIGHTS": '{"acme": 1e9}'}, "weight above 0"),
    ({"PAL_TENANT_WEIGHTS": '{"": 2}'}, "weight above 0"),
])
def test_bad_admission_settings_are_refused(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert says in str(info.value)
