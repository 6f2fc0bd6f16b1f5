"""The demo's tools (`pal demo`): registered only where the demo imports this module, its worker
(PAL_TOOL_MODULES) and the demo command itself, never in another `pal` process, so a team's own
tool of the same name is theirs (pal.cli.demo_graph has the graph)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pal.cli.demo_graph import LEDGER_VARIABLE, SLOW_CUSTOMER, SLOW_LOOKUP_S
from pal.tools import tool

_CUSTOMERS = {
    "acme": {"contact": "Ada at Acme", "plan": "pro"},
    "globex": {"contact": "Grace at Globex", "plan": "free"},
    SLOW_CUSTOMER: {"contact": "Ian at Initech", "plan": "enterprise"},
}


def _record(name: str, **args: Any) -> None:
    """Append one tool call to the ledger: the demo counts calls to show what a crash repeated."""
    ledger = os.environ.get(LEDGER_VARIABLE)
    if ledger:
        with open(ledger, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": name, **args}) + "\n")


@tool
def classify_ticket(text: str) -> dict[str, str]:
    """A keyword classifier: cheap rules first, the model only for the reply."""
    _record("classify_ticket", key=text)
    lowered = text.lower()
    if any(word in lowered for word in ("charged", "refund", "invoice")):
        return {"category": "billing", "priority": "high"}
    if any(word in lowered for word in ("down", "500", "outage")):
        return {"category": "incident", "priority": "high"}
    return {"category": "how-to", "priority": "normal"}


@tool
def lookup_customer(name: str) -> dict[str, str]:
    _record("lookup_customer", key=name)
    if name == SLOW_CUSTOMER:
        time.sleep(SLOW_LOOKUP_S)  # a slow CRM: the demo kills the worker while this step runs
    return _CUSTOMERS.get(name, {"contact": name, "plan": "free"})


@tool
def page_on_call(ticket: str, category: str) -> dict[str, Any]:
    _record("page_on_call", key=ticket)
    return {"paged": f"on-call for {category}", "ticket": ticket}
