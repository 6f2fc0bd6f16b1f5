"""`pal demo`: triage support tickets with a small agent graph on the embedded default.

The graph fans out (classify the ticket, look up the customer), joins, branches on urgency and
drafts a reply with an ai-step. The model is the offline `scripted` provider unless OPENAI_API_KEY
or ANTHROPIC_API_KEY is set, in which case the reply comes from that provider. The demo starts its
own `pal worker` process, so every node is one Celery message handled by another process, and
every step lands in the journal with its tokens and cost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pal.tools import tool

DEMO_TICKETS = [
    {"id": "T-1001", "customer": "acme", "text": "I was charged twice this month, please refund!"},
    {"id": "T-1002", "customer": "globex", "text": "How do I export my data to CSV?"},
    {"id": "T-1003", "customer": "initech", "text": "Production is down, the API returns 500s"},
]

def demo_model(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(provider, model) of the demo's ai-step: a real provider when its key is set."""
    env = os.environ if env is None else env
    if env.get("OPENAI_API_KEY"):
        return "openai", "gpt-4o-mini"
    if env.get("ANTHROPIC_API_KEY"):
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
            {"id": "escalate", "type": "tool",
             "data": {"tool": "page_on_call",
                      "args": {"ticket": "{{ input.id }}",
                               "category": "{{ nodes.classify.output.category }}"}}},
            _draft("urgent_reply", True, provider, model),
            _draft("reply", False, provider, model),
            {"id": "escalated", "type": "output",
             "data": {"value": {"ticket": "{{ input.id }}", "reply": "{{ nodes.urgent_reply.output.text }}",
                                "paged": "{{ nodes.escalate.output.paged }}"}}},
            {"id": "answered", "type": "output",
             "data": {"value": {"ticket": "{{ input.id }}", "reply": "{{ nodes.reply.output.text }}"}}},
        ],
        "edges": [
            {"source": "ticket", "target": "classify"},
            {"source": "ticket", "target": "customer"},
            {"source": "classify", "target": "is_urgent"},
            {"source": "customer", "target": "is_urgent"},
            {"source": "is_urgent", "target": "escalate", "sourceHandle": "true"},
            {"source": "escalate", "target": "urgent_reply"},
            {"source": "urgent_reply", "target": "escalated"},
            {"source": "is_urgent", "target": "reply", "sourceHandle": "false"},
            {"source": "reply", "target": "answered"},
        ],
    }


TRIAGE_GRAPH = triage_graph()

_CUSTOMERS = {
    "acme": {"contact": "Ada at Acme", "plan": "pro"},
    "globex": {"contact": "Grace at Globex", "plan": "free"},
    "initech": {"contact": "Ian at Initech", "plan": "enterprise"},
}


@tool
def classify_ticket(text: str) -> dict[str, str]:
    """A keyword classifier: cheap rules first, the model only for the reply."""
    lowered = text.lower()
    if any(word in lowered for word in ("charged", "refund", "invoice")):
        return {"category": "billing", "priority": "high"}
    if any(word in lowered for word in ("down", "500", "outage")):
        return {"category": "incident", "priority": "high"}
    return {"category": "how-to", "priority": "normal"}


@tool
def lookup_customer(name: str) -> dict[str, str]:
    return _CUSTOMERS.get(name, {"contact": name, "plan": "free"})


@tool
def page_on_call(ticket: str, category: str) -> dict[str, Any]:
    return {"paged": f"on-call for {category}", "ticket": ticket}


def start_worker_process(home: Path, concurrency: int = 2) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    modules = [m for m in env.get("PAL_TOOL_MODULES", "").split(",") if m]
    env["PAL_TOOL_MODULES"] = ",".join([*modules, "pal.cli.demo"])
    log_path = home / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "pal.cli", "worker", "--concurrency", str(concurrency)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(predicate: Any, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())
