"""Graph builders for tests: short to write, React Flow shaped."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def counted(node_id: str, path: Path, value: Any = None) -> dict[str, Any]:
    """A tool node that records each call of itself in `path`."""
    return {"id": node_id, "type": "tool",
            "data": {"tool": "count", "args": {"path": str(path), "label": node_id,
                                                "value": value}}}


def edge(source: str, target: str, handle: str | None = None) -> dict[str, Any]:
    return {"source": source, "target": target} | ({"sourceHandle": handle} if handle else {})


def linear(path: Path, length: int) -> dict[str, Any]:
    nodes = [{"id": "start", "type": "trigger"}]
    nodes += [counted(f"s{i}", path, i) for i in range(length)]
    nodes.append({"id": "out", "type": "output", "data": {"value": f"{{{{ nodes.s{length - 1}.output.value }}}}"}})
    ids = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [edge(a, b) for a, b in itertools.pairwise(ids)]}


def branching(path: Path) -> dict[str, Any]:
    """start -> check(input.big) -> yes | no -> out_yes | out_no."""
    return {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "check", "type": "condition", "data": {"expression": "{{ input.big }}"}},
            counted("yes", path, "big"),
            counted("no", path, "small"),
            {"id": "out_yes", "type": "output", "data": {"value": "{{ nodes.yes.output.value }}"}},
            {"id": "out_no", "type": "output", "data": {"value": "{{ nodes.no.output.value }}"}},
        ],
        "edges": [edge("start", "check"), edge("check", "yes", "true"), edge("check", "no", "false"),
                  edge("yes", "out_yes"), edge("no", "out_no")],
    }


def fan_out_in(path: Path, width: int) -> dict[str, Any]:
    """start -> b0..bN (parallel) -> join -> out; join waits for every branch."""
    branches = [counted(f"b{i}", path, i) for i in range(width)]
    total = " + ".join(f"nodes.b{i}.output.value" for i in range(width))
    return {
        "nodes": [{"id": "start", "type": "trigger"}, *branches, counted("join", path),
                  {"id": "out", "type": "output", "data": {"value": f"{{{{ {total} }}}}"}}],
        "edges": [*(edge("start", b["id"]) for b in branches),
                  *(edge(b["id"], "join") for b in branches), edge("join", "out")],
    }


def failing() -> dict[str, Any]:
    return {
        "nodes": [{"id": "start", "type": "trigger"},
                  {"id": "bad", "type": "tool", "data": {"tool": "explode", "args": {"message": "kaput"}}},
                  {"id": "out", "type": "output", "data": {"value": 1}}],
        "edges": [edge("start", "bad"), edge("bad", "out")],
    }


def single(node: dict[str, Any]) -> dict[str, Any]:
    """start -> node -> out, where out is the node's output."""
    return {"nodes": [{"id": "start", "type": "trigger"}, node,
                      {"id": "out", "type": "output", "data": {"value": f"{{{{ nodes.{node['id']}.output }}}}"}}],
            "edges": [edge("start", node["id"]), edge(node["id"], "out")]}


def flaky(path: Path, failures: int, retry: dict[str, Any] | None, error: str = "tool") -> dict[str, Any]:
    """A graph whose one tool fails `failures` times before it succeeds."""
    data: dict[str, Any] = {"tool": "flaky", "args": {"path": str(path), "label": "f", "failures": failures,
                                                      "error": error}}
    if retry is not None:
        data["retry"] = retry
    return single({"id": "f", "type": "tool", "data": data})


def webhook(url: str, *, idempotent: bool = False, retry: dict[str, Any] | None = None) -> dict[str, Any]:
    """start -> notify (a connector POSTing the input's ticket to `url`) -> out."""
    data: dict[str, Any] = {"url": url, "body": {"ticket": "{{ input.ticket }}"}, "headers": {"X-Source": "pal"}}
    if idempotent:
        data["idempotentReceiver"] = True
    if retry is not None:
        data["retry"] = retry
    return single({"id": "notify", "type": "connector", "data": data})


def email(*, idempotent: bool = False) -> dict[str, Any]:
    """start -> notify (an email about the input's ticket) -> out."""
    data: dict[str, Any] = {"to": "{{ input.to }}", "subject": "Ticket {{ input.ticket }}",
                            "body": "Your ticket {{ input.ticket }} was answered."}
    if idempotent:
        data["idempotentReceiver"] = True
    return single({"id": "notify", "type": "email", "data": data})
