"""The plan of a plain-LLM run is pure: given completed turns and tool calls, what comes next."""

from __future__ import annotations

from typing import Any

import pytest

from pal.errors import GraphError
from pal.nodes.llm_turn import conversation
from pal.plan.llm import parse_llm_spec


def turn(text: str = "", calls: int = 0) -> dict[str, Any]:
    return {"text": text, "tool_calls": [{"id": f"c{i}", "name": "echo", "arguments": {"i": i}}
                                         for i in range(calls)]}


SPEC = {"kind": "llm", "prompt": "hi {{ input.name }}", "tools": ["echo"], "maxTurns": 3}


def test_a_new_run_starts_at_turn_1() -> None:
    program = parse_llm_spec(SPEC, known_tools=frozenset({"echo"}))
    assert program.first_step == "turn-1"
    assert program.redrive_steps({}) == ("turn-1",)
    assert program.node("turn-1").type == "llm-turn"
    assert program.node("turn-2.tool-1").data["index"] == 1


def test_tool_calls_fan_out_and_the_next_turn_waits_for_all_of_them() -> None:
    program = parse_llm_spec(SPEC, known_tools=None)
    done = {"turn-1": turn(calls=2)}
    assert program.handoff(done, "turn-1").dispatch == ("turn-1.tool-0", "turn-1.tool-1")
    done["turn-1.tool-1"] = {"ok": 1}
    assert program.handoff(done, "turn-1.tool-1").dispatch == ()  # tool-0 still running
    done["turn-1.tool-0"] = {"ok": 0}
    assert program.handoff(done, "turn-1.tool-0").dispatch == ("turn-2",)
    assert program.redrive_steps(done) == ("turn-2",)


def test_a_turn_without_tool_calls_finishes_the_run_with_its_text() -> None:
    program = parse_llm_spec(SPEC, known_tools=None)
    done = {"turn-1": turn(calls=1), "turn-1.tool-0": 1, "turn-2": turn("the answer")}
    decision = program.handoff(done, "turn-2")
    assert decision.finished and decision.error is None
    assert decision.output == {"text": "the answer", "turns": 2}
    assert program.redrive_steps(done) == ()


def test_the_turn_limit_fails_the_run_before_running_the_last_turns_tools() -> None:
    program = parse_llm_spec(SPEC | {"maxTurns": 1}, known_tools=None)
    decision = program.handoff({"turn-1": turn(calls=2)}, "turn-1")
    assert decision.finished and decision.dispatch == ()  # no turn would read their results
    assert decision.error is not None and decision.error["code"] == "turn_limit_reached"


def test_unknown_steps_are_not_part_of_the_plan() -> None:
    program = parse_llm_spec(SPEC, known_tools=None)
    for step in ("turn-0", "turn-4", "start", "turn-1.x", "turn-1.tool-a"):
        with pytest.raises(KeyError):
            program.node(step)


def test_the_conversation_is_rebuilt_from_the_journal() -> None:
    outputs = {"turn-1": turn("let me look", calls=1), "turn-1.tool-0": {"found": True}}
    messages = conversation("question", outputs, upto=2)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c0", "name": "echo", "content": '{"found": true}'}


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"kind": "llm"}, "'prompt' is required"),
    ({"kind": "llm", "prompt": "x", "provider": "acme"}, "unknown provider 'acme'"),
    ({"kind": "llm", "prompt": "x", "maxTurns": 0}, "'maxTurns' must be from 1 to 100"),
    ({"kind": "llm", "prompt": "x", "maxTurns": "5"}, "'maxTurns' must be int"),
    ({"kind": "llm", "prompt": "x", "tools": ["nope"]}, "unknown tool 'nope'"),
    ({"kind": "llm", "prompt": "x", "colour": 1}, "unknown key 'colour'"),
    ({"kind": "llm", "prompt": "{{ secrets.key }}"}, "unknown name(s) secrets"),
    ({"kind": "llm", "prompt": "x", "retry": {"maxAttempts": 0}}, "maxAttempts"),
])
def test_bad_specs_are_refused_with_every_problem(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(GraphError) as caught:
        parse_llm_spec(spec, known_tools=frozenset({"echo"}))
    assert "invalid llm run" in str(caught.value)
    assert fragment in str(caught.value)
