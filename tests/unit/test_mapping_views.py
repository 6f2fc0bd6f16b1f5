"""The per-step views of completed outputs behave as the dicts they replace."""

from __future__ import annotations

import pytest

from pal.core import templates
from pal.core.views import AsNodeOutputs, OnlyKeys, WithOne


def test_only_keys_shows_the_allowed_keys_and_nothing_else() -> None:
    source = {"a": 1, "loop[0].b": 2, "c": None}
    view = OnlyKeys(source, {"a", "c", "never_completed"})
    assert dict(view) == {"a": 1, "c": None}
    assert len(view) == 2 and "loop[0].b" not in view and "never_completed" not in view
    with pytest.raises(KeyError):
        view["loop[0].b"]
    source["a"] = 5  # a view, not a copy
    assert view["a"] == 5


def test_node_outputs_read_as_templates_expect() -> None:
    view = AsNodeOutputs({"s0": {"value": 3}, "s1": [1, 2]})
    assert dict(view) == {"s0": {"output": {"value": 3}}, "s1": {"output": [1, 2]}}
    context = {"input": {}, "nodes": view, "run": {"id": "r"}}
    assert templates.render("{{ nodes.s0.output.value + nodes.s1.output[1] }}", context) == 5
    assert templates.render("{{ nodes | length }}", context) == 2


def test_with_one_adds_or_replaces_one_key() -> None:
    source = {"a": 1, "b": 2}
    added = WithOne(source, "c", 3)
    assert dict(added) == {"a": 1, "b": 2, "c": 3} and len(added) == 3
    replaced = WithOne(source, "a", 9)
    assert dict(replaced) == {"a": 9, "b": 2} and len(replaced) == 2
    assert source == {"a": 1, "b": 2}
    with pytest.raises(KeyError):
        added["d"]
