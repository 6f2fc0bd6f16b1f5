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


def test_no_pal_command_registers_the_demos_tools_but_the_demo() -> None:
    """A team's own `classify_ticket` (the README's example) is theirs in every `pal` process."""
    import subprocess
    import sys

    probe = ("import pal.cli.app\n"
             "from pal.tools import registered_tools, tool\n"
             "print(sorted(registered_tools()))\n"
             "@tool\n"
             "def classify_ticket(text: str) -> dict:\n"
             "    return {}\n"
             "print('registered')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "classify_ticket" not in out.stdout.splitlines()[0] and "page_on_call" not in out.stdout
    assert out.stdout.splitlines()[-1] == "registered"
