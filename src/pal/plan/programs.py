"""A run's plan from its document: a graph, or a plain-LLM spec (`{"kind": "llm", ...}`).

One place decides which it is and validates it, for new runs, for subagents' child runs and for a
subagent node's embedded graph at validation time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pal.config import DEFAULT_MAX_JSON_DEPTH
from pal.core.vms import is_microvm_document
from pal.errors import GraphError
from pal.plan.documents import check_depth, check_size, load_graph_text
from pal.plan.graph import parse_graph
from pal.plan.interpreter import GraphProgram, Program
from pal.plan.llm import is_llm_document, parse_llm_spec
from pal.plan.microvm import parse_microvm


@dataclass(frozen=True)
class Plan:
    kind: str  # "graph" | "llm" | "microvm"
    document: dict[str, Any]  # the canonical snapshot stored with the run
    hash: str
    program: Program


def parse_plan(document: Any, *, known_tools: frozenset[str] | None, max_bytes: int | None = None,
               max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Plan:
    """Validate a graph or plain-LLM document; GraphError lists every problem."""
    if isinstance(document, str):
        document = load_graph_text(document, max_bytes=max_bytes)
    check_depth(document, max_depth)
    if is_microvm_document(document):
        check_size(document, max_bytes=max_bytes, what="microVM run", error_what="microVM run")
        vm = parse_microvm(document)
        return Plan("microvm", vm.document(), vm.hash, vm)
    if is_llm_document(document):
        check_size(document, max_bytes=max_bytes, what="llm run spec", error_what="llm run")
        llm = parse_llm_spec(document, known_tools=known_tools)
        return Plan("llm", llm.document(), llm.hash, llm)
    graph = parse_graph(document, known_tools=known_tools, max_bytes=max_bytes, embedded=plan_problems)
    return Plan("graph", graph.document(), graph.hash, GraphProgram(graph))


def program_of(kind: str, document: Any) -> Program:
    """The program of a stored (already validated) plan."""
    if kind == "llm":
        return parse_llm_spec(document, known_tools=None)
    if kind == "microvm":
        return parse_microvm(document)
    return GraphProgram(parse_graph(document))


def plan_problems(document: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
    """The problems of an embedded plan (a subagent's graph), empty when valid."""
    if is_microvm_document(document):
        return ["a subagent's plan is a graph or a plain-LLM run, not a microVM run"]
    try:
        parse_plan(dict(document), known_tools=known_tools)
    except GraphError as exc:
        return exc.problems
    return []
