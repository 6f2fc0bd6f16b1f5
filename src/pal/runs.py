"""Starting and re-driving runs: validate everything first, then one transaction, then publish."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pal.errors import GraphError, InputError
from pal.graph import load_graph_text, parse_graph
from pal.interpreter import GraphProgram
from pal.journal import RunRecord
from pal.llm_runs import is_llm_document, parse_llm_spec
from pal.runtime import Runtime
from pal.steps import utcnow
from pal.tools import registered_tools

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


def check_run_input(run_input: Any, max_bytes: int) -> Any:
    """The input as it will be stored; InputError when it is not JSON or too large."""
    try:
        text = json.dumps(run_input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(f"run input must be JSON: {exc}") from exc
    if len(text.encode()) > max_bytes:
        raise InputError(f"run input is {len(text.encode())} bytes, over the limit of "
                         f"{max_bytes} (PAL_MAX_INPUT_BYTES)")
    return json.loads(text)


def start_run(
    rt: Runtime,
    graph: Any,
    run_input: Any = None,
    *,
    run_id: str | None = None,
    tenant_id: str | None = None,
) -> tuple[RunRecord, bool]:
    """Validate, create the run (idempotent on `run_id`) and publish its first step.

    `graph` is a graph document, or a plain-LLM spec (`{"kind": "llm", ...}`). Returns the run and
    whether this call created it. Nothing is written for invalid input.
    """
    settings = rt.settings
    if run_id is not None and (not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id)):
        raise InputError(f"run id {run_id!r} is invalid: 1-128 letters, digits, _ . : - "
                         "starting with a letter or digit")
    run_input = check_run_input(run_input, settings.max_input_bytes)
    if isinstance(graph, str):
        graph = load_graph_text(graph, max_bytes=settings.max_graph_bytes)
    if is_llm_document(graph):
        size = len(json.dumps(graph, default=str).encode())
        if size > settings.max_graph_bytes:
            raise GraphError([f"llm run spec is {size} bytes, over the limit of "
                              f"{settings.max_graph_bytes} (PAL_MAX_GRAPH_BYTES)"], what="llm run")
        llm = parse_llm_spec(graph, known_tools=registered_tools())
        kind, document, plan_hash, first = "llm", llm.document(), llm.hash, llm.first_step
    else:
        parsed = parse_graph(graph, known_tools=registered_tools(),
                             max_bytes=settings.max_graph_bytes)
        kind, document, plan_hash = "graph", parsed.document(), parsed.hash
        first = GraphProgram(parsed).first_step
    record, created = rt.journal.create_run(
        run_id=run_id or new_run_id(), tenant_id=tenant_id or settings.tenant, kind=kind,
        graph=document, graph_hash=plan_hash, run_input=run_input, now=utcnow(),
        lease_ttl=settings.lease_ttl,
    )
    if created:
        rt.publish(record.id, first, 1)
    return record, created
