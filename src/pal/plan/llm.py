"""Plain-LLM runs (`kind: llm`): a model, a system prompt, tools and a turn limit, no graph.

    {"kind": "llm", "provider": "openai", "model": "gpt-4o-mini", "system": "...",
     "prompt": "{{ input.question }}", "tools": ["lookup_order"], "maxTurns": 6}

Each model turn and each tool call is its own journaled step (`turn-N`, `turn-N.tool-I`), planned
by `LlmProgram`, a pure function of the completed steps like the graph interpreter: a crash at turn
5 replays turns 1 to 4 from the journal and calls the model again only for turn 5.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pal.config import DEFAULT_MAX_TURNS
from pal.core import retry, templates
from pal.core.failures import failure_payload
from pal.core.records import Handoff
from pal.errors import GraphError, TurnLimitReached
from pal.nodes.ai_step import DEFAULT_MODEL, DEFAULT_PROVIDER, provider_problems
from pal.nodes.llm_turn import tool_step_id, turn_id
from pal.plan.model import Node

MAX_TURNS_LIMIT = 100
SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,), "name": (str,), "description": (str,), "provider": (str,), "model": (str,),
    "system": (str,), "prompt": (str,), "tools": (list,), "maxTurns": (int,), "maxTokens": (int,),
    "temperature": (int, float), "script": (list,), "retry": (dict,),
}


def is_llm_document(document: Any) -> bool:
    return isinstance(document, Mapping) and document.get("kind") == "llm"


@dataclass(frozen=True)
class LlmProgram:
    """The plan of a plain-LLM run; build it with `parse_llm_spec`."""

    spec: Mapping[str, Any]

    @property
    def first_step(self) -> str:
        return turn_id(1)

    @property
    def max_turns(self) -> int:
        return int(self.spec.get("maxTurns", DEFAULT_MAX_TURNS))

    def document(self) -> dict[str, Any]:
        return dict(self.spec)

    @cached_property
    def hash(self) -> str:
        canonical = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def node(self, step_id: str) -> Node:
        turn_part, _, tool_part = step_id.partition(".")
        if not turn_part.startswith("turn-") or not turn_part[5:].isdigit():
            raise KeyError(step_id)
        turn = int(turn_part[5:])
        if not 1 <= turn <= self.max_turns:
            raise KeyError(step_id)
        tools = list(self.spec.get("tools", []))
        if not tool_part:
            data = {k: v for k, v in self.spec.items() if k not in ("kind", "name", "description")}
            return Node(id=step_id, type="llm-turn", data=data | {"turn": turn})
        if not tool_part.startswith("tool-") or not tool_part[5:].isdigit():
            raise KeyError(step_id)
        data = {"turn": turn, "index": int(tool_part[5:]), "tools": tools}
        if "retry" in self.spec:
            data["retry"] = self.spec["retry"]
        return Node(id=step_id, type="llm-tool", data=data)

    def _state(self, completed: Mapping[str, Any]) -> Handoff:
        """Ready steps in `dispatch`, or the end of the conversation."""
        turn = 1
        while True:
            current = turn_id(turn)
            if current not in completed:
                return Handoff(dispatch=(current,), finished=False)
            calls = (completed[current] or {}).get("tool_calls") or []
            if not calls:
                text = completed[current].get("text", "")
                return Handoff(dispatch=(), finished=True, output={"text": text, "turns": turn})
            if turn >= self.max_turns:  # no turn would read these tools' results: do not run them
                error = TurnLimitReached(
                    f"the model still asked for tools after {turn} turn(s) (maxTurns {self.max_turns})")
                return Handoff(dispatch=(), finished=True, error=failure_payload(error))
            waiting = tuple(tool_step_id(turn, i) for i in range(len(calls))
                            if tool_step_id(turn, i) not in completed)
            if waiting:
                return Handoff(dispatch=waiting, finished=False)
            turn += 1

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff:
        before = self._state({k: v for k, v in completed.items() if k != step_id})
        now = self._state(completed)
        if now.finished:
            return now
        return Handoff(dispatch=tuple(s for s in now.dispatch if s not in before.dispatch),
                       finished=False)

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]:
        return self._state(completed).dispatch

    def is_ready(self, completed: Mapping[str, Any], step_id: str) -> bool:
        return step_id in self._state(completed).dispatch

    def needs(self, completed: Mapping[str, Any], step_id: str) -> frozenset[str] | None:
        return None  # a turn's steps follow from the model's reply, not from completions alone

    def view(self, step_id: str, completed: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any]:
        return completed, None

    def times_called(self, completed: Mapping[str, Any], step_id: str) -> int:
        """How many times, up to and including tool step `step_id`, the model asked for the same
        tool with the same arguments (0 for a step that is not a tool call)."""
        turn_part, _, tool_part = step_id.partition(".")
        if not tool_part.startswith("tool-") or not turn_part.startswith("turn-"):
            return 0
        turn, index = int(turn_part[5:]), int(tool_part[5:])
        calls = (completed.get(turn_id(turn)) or {}).get("tool_calls") or []
        if index >= len(calls):
            return 0
        wanted = _call_key(calls[index])
        count = 0
        for earlier in range(1, turn + 1):
            asked = (completed.get(turn_id(earlier)) or {}).get("tool_calls") or []
            count += sum(1 for i, call in enumerate(asked)
                         if (earlier, i) <= (turn, index) and _call_key(call) == wanted)
        return count


def _call_key(call: Any) -> str:
    """A tool call as comparable text: its tool and its arguments, canonical JSON."""
    if not isinstance(call, Mapping):
        return json.dumps(call, sort_keys=True, default=str)
    return json.dumps([call.get("name"), call.get("arguments")], sort_keys=True, default=str)


def parse_llm_spec(document: Mapping[str, Any], *, known_tools: frozenset[str] | None) -> LlmProgram:
    """Validate a `kind: llm` document; GraphError lists every problem at once."""
    problems: list[str] = []
    for key, value in document.items():
        types = SPEC_FIELDS.get(key)
        if types is None:
            problems.append(f"unknown key {key!r} (allowed: {', '.join(sorted(SPEC_FIELDS))})")
        elif (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            problems.append(f"{key!r} must be {' or '.join(t.__name__ for t in types)}, "
                            f"not {type(value).__name__}")
    if not isinstance(document.get("prompt"), str):
        problems.append("'prompt' is required: the first user message (a template over input)")
    problems += provider_problems(document)
    turns = document.get("maxTurns", DEFAULT_MAX_TURNS)
    if isinstance(turns, int) and not 1 <= turns <= MAX_TURNS_LIMIT:
        problems.append(f"'maxTurns' must be from 1 to {MAX_TURNS_LIMIT}, not {turns}")
    tools = document.get("tools", [])
    if isinstance(tools, list):
        for name in tools:
            if not isinstance(name, str):
                problems.append(f"'tools' must list tool names, not {name!r}")
            elif known_tools is not None and name not in known_tools:
                problems.append(f"unknown tool {name!r} (registered: {', '.join(sorted(known_tools))}; "
                                "see PAL_TOOL_MODULES)")
    if "retry" in document:
        problems += retry.policy_problems(document["retry"])
    for key in ("prompt", "system"):
        text = document.get(key)
        if isinstance(text, str):
            error = templates.check(text)
            if error:
                problems.append(f"{key}: {error}")
    if problems:
        raise GraphError(problems, what="llm run")
    spec = {"provider": DEFAULT_PROVIDER, "model": DEFAULT_MODEL, "maxTurns": DEFAULT_MAX_TURNS,
            **json.loads(json.dumps(dict(document)))}
    return LlmProgram(spec)
