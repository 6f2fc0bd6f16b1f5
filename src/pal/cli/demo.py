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
from typing import Annotated, Any

import typer

from pal.cli import common
from pal.cli.common import EXIT_RUN_FAILED, EXIT_TIMEOUT
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


def demo(
    tickets: Annotated[int, typer.Option(min=1, max=len(DEMO_TICKETS),
                                         help="How many tickets to triage.")] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the runs.")] = 120.0,
) -> None:
    """Triage support tickets with an agent graph, one node per Celery message, and print the
    journal. Uses the embedded default (SQLite + filesystem broker) unless PAL_* say otherwise."""
    from pal.cli.progress import console, describe, journal_table
    from pal.storage.database import shared_engine
    from pal.storage.schema.migrate import upgrade

    settings = common.settings()
    out = console()
    out.print(f"PAL demo: journal {settings.database_url}, broker {settings.broker_url}")
    upgrade(shared_engine(settings.database_url))
    out.print("schema up to date; starting a `pal worker` process (2 children)…")
    worker_process = start_worker_process(settings.home)
    try:
        client = common.client()
        names: dict[str, str] = {}
        provider, model = demo_model()
        out.print(f"replies are drafted by an ai-step: provider {provider}, model {model}"
                  + (" (offline; set OPENAI_API_KEY or ANTHROPIC_API_KEY for a real one)"
                     if provider == "scripted" else ""))
        graph = triage_graph(provider, model)
        for ticket in DEMO_TICKETS[:tickets]:
            run_id = client.start_run(graph, ticket)
            names[run_id] = ticket["id"]
            out.print(f"queued {run_id} for ticket {ticket['id']}: {ticket['text']!r}")
        seen = dict.fromkeys(names, 0)

        def drain() -> bool:
            for run_id, last in seen.items():
                for event in client.events(run_id, last):
                    out.print(f"  [{names[run_id]}] {describe(event)}")
                    seen[run_id] = event.seq
            return all(client.get_run(r).terminal for r in names)

        if not wait_until(drain, timeout):
            common.fail(f"runs not finished after {timeout:g}s; see {settings.home}/demo-worker.log",
                  EXIT_TIMEOUT)
        drain()
        failed = 0
        for run_id, ticket_id in names.items():
            record = client.get_run(run_id)
            failed += record.status != "succeeded"
            out.print(journal_table(client.events(run_id),
                                    f"journal of {run_id} (ticket {ticket_id}): {record.status}, "
                                    f"{record.input_tokens}+{record.output_tokens} tokens, "
                                    f"${record.cost_usd:.6f}"))
        out.print(f"{len(names) - failed} of {len(names)} runs succeeded; "
                  f"each step above was one Celery message. Inspect with `pal runs list`.")
        if failed:
            raise typer.Exit(EXIT_RUN_FAILED)
    finally:
        stop_process(worker_process)
