"""The per-step views of completed outputs behave as the dicts they replace."""

from __future__ import annotations

import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pal.core import templates
from pal.core.views import AsNodeOutputs, GrowingOutputs, OnlyKeys, WithOne


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


def test_growing_outputs_share_one_record_and_each_view_keeps_its_own_entries() -> None:
    first = GrowingOutputs().added({"a": 1})
    second = first.added({"b": 2})
    third = second.added({"c": 3})
    assert third._record is first._record  # extended at its tip: appended, not copied
    assert dict(first) == {"a": 1} and dict(second) == {"a": 1, "b": 2}
    assert list(third) == ["a", "b", "c"] and len(third) == 3 and third["c"] == 3
    assert "c" not in second and second.get("c") is None
    with pytest.raises(KeyError):
        second["c"]
    # An older view extended again (a stale log read anew) gets its own copy: the first
    # branch keeps what it saw.
    branch = second.added({"x": 9})
    assert branch._record is not third._record
    assert dict(branch) == {"a": 1, "b": 2, "x": 9} and dict(third) == {"a": 1, "b": 2, "c": 3}
    # A key that reappears takes its new value in a copy, as a dict assignment would.
    again = third.added({"a": 7})
    assert dict(again) == {"a": 7, "b": 2, "c": 3} and third["a"] == 1


@given(st.lists(st.tuples(st.integers(0, 5), st.dictionaries(st.sampled_from("abcdefgh"), st.integers(),
                                                               max_size=3)), max_size=12))
def test_growing_outputs_behave_as_copied_dicts(steps: list[tuple[int, dict[str, int]]]) -> None:
    """Any sequence of extensions, each from any earlier view, matches the dicts a copy per
    extension would give, and no earlier view changes."""
    views, models = [GrowingOutputs()], [{}]
    for parent, new in steps:
        index = parent % len(views)
        views.append(views[index].added(new))
        models.append(dict(models[index]) | new)
        assert all(dict(v) == m and len(v) == len(m) and list(v) == list(m) for v, m in zip(views, models, strict=True))


def test_growing_outputs_extended_from_threads_lose_nothing() -> None:
    """Two threads extending the same view at once: one appends, the other copies; both views
    have their own entries and the base is unchanged."""
    base = GrowingOutputs().added({"start": 0})
    results: dict[str, GrowingOutputs] = {}
    barrier = threading.Barrier(2)

    def extend(name: str) -> None:
        barrier.wait()
        view = base
        for i in range(200):
            view = view.added({f"{name}{i}": i})
        results[name] = view

    threads = [threading.Thread(target=extend, args=(n,)) for n in ("p", "q")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert dict(base) == {"start": 0}
    for name in ("p", "q"):
        assert dict(results[name]) == {"start": 0} | {f"{name}{i}": i for i in range(200)}


def test_a_view_is_read_while_another_thread_appends_to_its_record() -> None:
    """Reading (and copying) an older view while the newest one's record grows never fails: a
    dict walked while it grows would raise 'dictionary changed size during iteration'."""
    old = GrowingOutputs().added({f"k{i}": i for i in range(50)})
    stop = threading.Event()
    failures: list[BaseException] = []

    def append() -> None:
        view = old
        for i in range(20_000):
            if stop.is_set():
                return
            view = view.added({f"new{i}": i})

    def read() -> None:
        try:
            for _ in range(300):
                assert list(old) == [f"k{i}" for i in range(50)]
                assert dict(old.added({"k0": -1}))["k0"] == -1  # an older view's copy walks it too
        except BaseException as exc:  # the test reports what the reader met
            failures.append(exc)
        finally:
            stop.set()

    writer, reader = threading.Thread(target=append), threading.Thread(target=read)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: races show
    try:
        writer.start()
        reader.start()
        reader.join()
        writer.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
