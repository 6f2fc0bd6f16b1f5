"""The private Celery and kombu names PAL's fast paths use (pal.workers.celery_private): each is
checked against the installed versions, a changed one turns its path off, and no other module
reaches one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kombu
import pytest

from pal.errors import ConfigError
from pal.workers import celery_private
from pal.workers.celery_private import PATHS, Need

SRC = Path(celery_private.__file__).resolve().parents[1]
# The classes that override kombu's or Celery's private methods, installed only with their path.
OVERRIDES = {"redis_transport.py": "redis_transport", "fs_transport.py": "atomic_files",
             "consumer.py": "event_batches"}
NEWEST_SHAPE = (5, 7)  # the kombu the fast paths are written against: every need holds there


def _kombu() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", kombu.__version__).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


@pytest.mark.parametrize(("path", "need"), [(p, n) for p, needs in PATHS.items() for n in needs],
                         ids=lambda v: v if isinstance(v, str) else f"{v.owner}.{v.name}")
def test_each_private_name_is_there_in_the_shape_pal_uses(path: str, need: Need) -> None:
    problem = need.problem()
    if _kombu() >= NEWEST_SHAPE:
        assert problem is None, problem
    elif problem is not None:  # an older kombu (the compat lane): the path is off, never half on
        assert not celery_private._checked("all").on(path)


class Shape:
    def _put(self, message: object) -> None:  # once `queue` first: a changed signature
        """A method whose parameters changed."""


def test_a_changed_or_missing_name_turns_its_path_off() -> None:
    changed = Need(f"{__name__}:Shape", "_put", ("queue",))
    assert changed.problem() == f"{__name__}:Shape._put takes (message), not (queue, …)"
    assert Need(f"{__name__}:Shape", "_gone").problem() == f"{__name__}:Shape._gone is gone"
    assert "is gone" in (Need("kombu.transport.no_such_module", "_x").problem() or "")
    assert Need(f"{__name__}:Shape", "_put", ("message",)).problem() is None


def test_the_switch_turns_paths_off_and_says_why() -> None:
    off = celery_private._checked("none")
    assert list(off.off) == list(PATHS) and not any(off.on(p) for p in PATHS)
    assert all(why == "PAL_CELERY_FAST_PATHS=none" for why in off.off.values())
    assert [line.split(":")[0] for line in celery_private.described(off)] == list(PATHS)
    some = celery_private._checked("inline, publisher")
    assert {"event_batches", "atomic_files", "redis_transport"} <= set(some.off)
    assert some.off["event_batches"] == "PAL_CELERY_FAST_PATHS=inline, publisher"
    with pytest.raises(ConfigError, match=r"no fast path publsher .*a comma list of: publisher, inline"):
        celery_private._checked("publsher")


def test_a_batch_is_kombus_where_it_has_one_else_each_publish_goes_at_once() -> None:
    class Old:
        pass

    with celery_private.publish_batch(Old()) as held:  # kombu 5.5: nothing to hold
        assert held is None


def _private_names() -> set[str]:
    return {need.name for needs in PATHS.values() for need in needs}


def test_no_other_module_reaches_a_private_celery_or_kombu_name() -> None:
    names, found = _private_names(), []
    for file in sorted(SRC.rglob("*.py")):
        if file.name == "celery_private.py":
            continue
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and re.match(r"(celery|kombu)(\.|$)", node.module or "") and (
                    any(part.startswith("_") for part in (node.module or "").split("."))
                    or any(alias.name.startswith("_") for alias in node.names)):
                found.append(f"{file.relative_to(SRC)}:{node.lineno} imports a private name")
            used = (node.attr if isinstance(node, ast.Attribute)
                    else node.name if isinstance(node, ast.FunctionDef) else None)
            if used in names and file.name not in OVERRIDES:
                found.append(f"{file.relative_to(SRC)}:{node.lineno} uses {used}")
    assert found == []
