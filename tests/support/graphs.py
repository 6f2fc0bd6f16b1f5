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


def approval(path: Path, *, expires: str | None = None, rejected: bool = False,
             timeout: bool = False) -> dict[str, Any]:
    """start -> gate (approval) -[approved]-> pay (counted) -> out; optional rejected/timeout branches."""
    gate: dict[str, Any] = {"prompt": "Refund {{ input.amount }} to {{ input.customer }}?",
                            "show": {"amount": "{{ input.amount }}"}}
    if expires:
        gate["expiresIn"] = expires
    nodes = [{"id": "start", "type": "trigger"}, {"id": "gate", "type": "approval", "data": gate},
             counted("pay", path, "paid"),
             {"id": "out", "type": "output", "data": {"value": "{{ nodes.pay.output.value }}"}}]
    edges = [edge("start", "gate"), edge("gate", "pay", "approved"), edge("pay", "out")]
    for branch, wanted in (("rejected", rejected), ("timeout", timeout)):
        if wanted:
            nodes.append(counted(f"on_{branch}", path, branch))
            edges.append(edge("gate", f"on_{branch}", branch))
    return {"nodes": nodes, "edges": edges}


def parent_of(child: dict[str, Any], *, child_input: Any = None, on_child_approval: str | None = None,
              step: str = "sub") -> dict[str, Any]:
    """start -> sub (a subagent running `child`) -> out (the child's output)."""
    data: dict[str, Any] = {"graph": child}
    if child_input is not None:
        data["input"] = child_input
    if on_child_approval:
        data["onChildApproval"] = on_child_approval
    return single({"id": step, "type": "subagent", "data": data})


def loop(path: Path, items: Any = "{{ input.items }}", max_iterations: int | None = None) -> dict[str, Any]:
    """start -> each (loop; body: work counted per item, then check) -> out (the collected list)."""
    data: dict[str, Any] = {"body": {
        "nodes": [{"id": "work", "type": "tool", "data": {"tool": "count", "args": {
                      "path": str(path), "label": "item-{{ loop.index }}", "value": "{{ loop.item }}"}}},
                  {"id": "check", "type": "tool", "data": {"tool": "echo", "args": {
                      "index": "{{ loop.index }}", "got": "{{ nodes.work.output.value }}"}}}],
        "edges": [edge("work", "check")]}}
    if items is not None:
        data["items"] = items
    if max_iterations is not None:
        data["maxIterations"] = max_iterations
    return single({"id": "each", "type": "loop", "data": data})
