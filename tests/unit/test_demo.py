"""The demo's ai-step uses the offline provider unless a real provider's key is set."""

from __future__ import annotations

import pytest

from pal.cli.demo_graph import demo_model, triage_graph
from pal.plan.graph import parse_graph


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ("scripted", "scripted-1")),
    ({"OPENAI_API_KEY": "sk-x"}, ("openai", "gpt-4o-mini")),
    ({"ANTHROPIC_API_KEY": "sk-ant-x"}, ("anthropic", "claude-haiku-4-5")),
    ({"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": "sk-ant-x"}, ("anthropic", "claude-haiku-4-5")),
])
def test_demo_model_follows_the_keys_that_are_set(env: dict[str, str], expected: tuple[str, str]) -> None:
    assert demo_model(env) == expected


@pytest.mark.parametrize("provider", ["scripted", "openai", "anthropic"])
def test_the_demo_graph_is_valid_for_every_provider(provider: str) -> None:
    graph = parse_graph(triage_graph(provider, "some-model"))
    drafts = [n for n in graph.nodes.values() if n.type == "ai-step"]
    assert len(drafts) == 2 and all(n.data["provider"] == provider for n in drafts)
