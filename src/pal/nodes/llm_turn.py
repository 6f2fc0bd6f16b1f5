"""The steps of a plain-LLM run (`kind: llm`): one model turn, or one tool call the model asked for.

These kinds are internal: graphs cannot name them. Step ids are deterministic, `turn-N` for the
Nth model call and `turn-N.tool-I` for its Ith tool call, so a replay finds every completed turn and
tool result in the journal and the provider sees each turn's call once per attempt.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any

from pal.nodes.ai_step import DEFAULT_MODEL, ModelCall, script_of
from pal.nodes.base import NodeKind, StepContext, run_to_end
from pal.providers import ModelRequest, ToolSpec
from pal.tools import describe_tool, get_tool


def turn_id(turn: int) -> str:
    return f"turn-{turn}"


def tool_step_id(turn: int, index: int) -> str:
    return f"turn-{turn}.tool-{index}"


def conversation(prompt: str, outputs: Mapping[str, Any], upto: int) -> tuple[dict[str, Any], ...]:
    """The messages of turn `upto`: the prompt, then each earlier turn and its tool results,
    rebuilt from the journal's completed outputs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for turn in range(1, upto):
        out = outputs[turn_id(turn)]
        calls = out.get("tool_calls") or []
        messages.append({"role": "assistant", "content": out.get("text", ""), "tool_calls": calls})
        for index, call in enumerate(calls):
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                             "content": json.dumps(outputs[tool_step_id(turn, index)])})
    return tuple(messages)


class LlmTurn(ModelCall):
    type_name = "llm-turn"

    def request(self, data: Mapping[str, Any], ctx: StepContext) -> ModelRequest:
        prompt = str(ctx.render(data.get("prompt", "")))
        system = ctx.render(data["system"]) if data.get("system") else None
        tools = tuple(ToolSpec(**describe_tool(name)) for name in data.get("tools", []))
        return ModelRequest(
            model=str(data.get("model", DEFAULT_MODEL)),
            messages=conversation(prompt, ctx.outputs, int(data["turn"])),
            system=str(system) if system is not None else None, tools=tools,
            max_tokens=int(data.get("maxTokens", 1024)), temperature=data.get("temperature"),
            script=script_of(data),
        )


class LlmTool(NodeKind):
    type_name = "llm-tool"

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        call = ctx.outputs[turn_id(int(data["turn"]))]["tool_calls"][int(data["index"])]
        name, arguments = call["name"], call.get("arguments") or {}
        if name not in data.get("tools", []):
            # The model's mistake is the model's to fix: it reads this result on its next turn.
            return {"error": f"unknown tool {name!r}; available: {', '.join(data.get('tools', []))}"}
        if not isinstance(arguments, Mapping):
            return {"error": f"arguments of {name!r} must be an object"}
        function = get_tool(name)
        try:
            inspect.signature(function).bind(**arguments)
        except TypeError as exc:  # wrong argument names: the model's to fix, like an unknown tool
            return {"error": f"bad arguments for {name!r}: {exc}"}
        result = function(**arguments)
        return run_to_end(result) if inspect.iscoroutine(result) else result
