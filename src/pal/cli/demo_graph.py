"""The demo's agent graph (`pal demo`, pal.cli.demo); its tools are in pal.cli.demo_tools.

Support-ticket triage: classify the ticket and look up the customer side by side, join, branch on
urgency; an urgent ticket asks a person before paging on-call (an `approval` node), then an ai-step
drafts the reply. The demo's worker imports pal.cli.demo_tools as a tool module; no other `pal`
process registers those tools. Every tool call is appended to a ledger file (PAL_DEMO_LEDGER), so
the demo can show which calls a crash repeated and which it did not.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LEDGER_VARIABLE = "PAL_DEMO_LEDGER"
SLOW_CUSTOMER = "initech"  # its CRM lookup takes SLOW_LOOKUP_S: long enough to crash a worker in it
SLOW_LOOKUP_S = 4.0

DEMO_TICKETS = [
    {"id": "T-1001", "customer": "acme", "text": "I was charged twice this month, please refund!"},
    {"id": "T-1002", "customer": "globex", "text": "How do I export my data to CSV?"},
    {"id": "T-1003", "customer": SLOW_CUSTOMER, "text": "Production is down, the API returns 500s"},
]



def demo_model(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(provider, model) of the demo's ai-step: a real provider when its key is set."""
    env = os.environ if env is None else env
    # A key without its SDK (an optional part, pal[openai]/pal[anthropic]) keeps the offline one.
    if env.get("OPENAI_API_KEY") and importlib.util.find_spec("openai") is not None:
        return "openai", "gpt-4o-mini"
    if env.get("ANTHROPIC_API_KEY") and importlib.util.find_spec("anthropic") is not None:
        return "anthropic", "claude-haiku-4-5"
    return "scripted", "scripted-1"


def _draft(node_id: str, urgent: bool, provider: str, model: str) -> dict[str, Any]:
    tone = "Apologise and promise an update within the hour." if urgent else "Be friendly and brief."
    return {"id": node_id, "type": "ai-step",
            "data": {"provider": provider, "model": model, "maxTokens": 200,
                     "system": f"You write replies for a support team. {tone}",
                     "prompt": "Reply to {{ nodes.customer.output.contact }} about their "
                               "{{ nodes.classify.output.category }} ticket: {{ input.text }}",
                     "retry": {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm", "timeout"]}}}


def triage_graph(provider: str = "scripted", model: str = "scripted-1") -> dict[str, Any]:
    return {
        "name": "support-triage",
        "nodes": [
            {"id": "ticket", "type": "trigger"},
            {"id": "classify", "type": "tool",
             "data": {"tool": "classify_ticket", "args": {"text": "{{ input.text }}"}}},
            {"id": "customer", "type": "tool",
             "data": {"tool": "lookup_customer", "args": {"name": "{{ input.customer }}"}}},
            {"id": "is_urgent", "type": "condition",
             "data": {"expression": "{{ nodes.classify.output.priority == 'high' "
                                    "or nodes.customer.output.plan == 'enterprise' }}"}},
            {"id": "page_ok", "type": "approval",
             "data": {"prompt": "Page on-call for ticket {{ input.id }} "
                                "({{ nodes.classify.output.category }})?",
                      "show": {"ticket": "{{ input.id }}", "customer": "{{ nodes.customer.output.contact }}",
                               "text": "{{ input.text }}"}}},
            {"id": "escalate", "type": "tool",
             "data": {"tool": "page_on_call",
                      "args": {"ticket": "{{ input.id }}",
                               "category": "{{ nodes.classify.output.category }}"}}},
            _draft("urgent_reply", True, provider, model),
            _draft("reply", False, provider, model),
            {"id": "escalated", "type": "output",
             "data": {"value": {"ticket": "{{ input.id }}", "reply": "{{ nodes.urgent_reply.output.text }}",
                                "paged": "{{ nodes.escalate.output.paged }}"}}},
            {"id": "not_paged", "type": "output",
             "data": {"value": {"ticket": "{{ input.id }}", "paged": False}}},
            {"id": "answered", "type": "output",
             "data": {"value": {"ticket": "{{ input.id }}", "reply": "{{ nodes.reply.output.text }}"}}},
        ],
        "edges": [
            {"source": "ticket", "target": "classify"},
            {"source": "ticket", "target": "customer"},
            {"source": "classify", "target": "is_urgent"},
            {"source": "customer", "target": "is_urgent"},
            {"source": "is_urgent", "target": "page_ok", "sourceHandle": "true"},
            {"source": "page_ok", "target": "escalate", "sourceHandle": "approved"},
            {"source": "page_ok", "target": "not_paged", "sourceHandle": "rejected"},
            {"source": "escalate", "target": "urgent_reply"},
            {"source": "urgent_reply", "target": "escalated"},
            {"source": "is_urgent", "target": "reply", "sourceHandle": "false"},
            {"source": "reply", "target": "answered"},
        ],
    }


def ledger_counts(ledger: Path) -> Counter[tuple[str, str]]:
    """(tool, ticket or customer) -> how many times it was called."""
    counts: Counter[tuple[str, str]] = Counter()
    if ledger.exists():
        for line in ledger.read_text(encoding="utf-8").splitlines():
            call = json.loads(line)
            counts[(call["tool"], str(call.get("key", "")))] += 1
    return counts
