"""Every example graph in docs/nodes.md runs as written, through a real Celery worker."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.confidence import GateMode
from pal.engine.recovery import sweep
from tests.conftest import REPO, Backend
from tests.support.servers import SmtpReceiver, WebhookReceiver
from tests.support.workers import in_process_worker

DOC = REPO / "docs" / "nodes.md"
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+)(?P<attrs>.*?) -->\s*```json\n(?P<body>.*?)```", re.S)
ATTR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def examples() -> list[Any]:
    found = []
    for match in EXAMPLE.finditer(DOC.read_text()):
        attrs = {k: v.strip() for k, v in ATTR.findall(match["attrs"].strip())}
        found.append(pytest.param(json.loads(match["body"]), attrs, id=match["name"]))
    return found


def test_every_node_kind_has_an_example() -> None:
    from pal.nodes import KINDS

    names = {p.id for p in examples()}
    assert set(KINDS) - {"output", "trigger"} <= names | {"tool"}, set(KINDS) - names


@pytest.fixture
def docs_client(sqlite_backend: Backend, tmp_path: Path) -> Iterator[tuple[Client, WebhookReceiver, SmtpReceiver]]:
    with WebhookReceiver() as receiver, SmtpReceiver() as smtp:
        # The confidence gate enforced: only the examples with a `confidence` block pass through it.
        client = Client(sqlite_backend.settings.with_(smtp_url=f"smtp://{smtp.host}:{smtp.port}",
                                                      confidence_gate=GateMode.ENFORCE))
        with in_process_worker(client, concurrency=2):
            yield client, receiver, smtp
        client.close()


@pytest.mark.parametrize(("document", "attrs"), examples())
def test_doc_example_runs(docs_client: tuple[Client, WebhookReceiver, SmtpReceiver],
                          document: dict[str, Any], attrs: dict[str, str]) -> None:
    client, receiver, smtp = docs_client
    text = json.dumps(document).replace("http://127.0.0.1:8765", receiver.url)
    run_id = client.start_run(json.loads(text), json.loads(attrs.get("input", "{}")))
    if "approve" in attrs:
        assert wait_until(lambda: bool(client.pending_approvals(run_id)), 60)
        client.approve(run_id, attrs["approve"], comment="from the docs test")
    if "signal" in attrs:  # what a service would send the waiting run
        sent = json.loads(attrs["signal"])
        assert wait_until(lambda: client.get_run(run_id).status == "waiting", 60)
        client.signal(run_id, sent["name"], sent.get("payload"))
    if "sweep" in attrs:  # no beat here: the test sweeps, as `pal beat` would, until the run ends
        assert wait_until(lambda: bool(sweep(client.runtime)) and client.get_run(run_id).terminal, 60)
    run = client.wait(run_id, timeout=60)
    assert run.status == attrs.get("status", "succeeded"), run.error
    if "code" in attrs:
        assert run.error["code"] == attrs["code"]
    if "anomaly" in attrs:
        assert [e.payload["kind"] for e in client.events(run_id) if e.kind == "anomaly_detected"] == [attrs["anomaly"]]
    if "confidence" in attrs:
        assert [e.payload["decision"] for e in client.events(run_id)
                if e.kind == "confidence_evaluated"] == [attrs["confidence"]]
    if "expect" in attrs:
        assert run.output == json.loads(attrs["expect"])
    if '"connector"' in text:
        assert len(receiver.effective_deliveries()) == 1
    if '"email"' in text:
        assert len(smtp.messages) == 1
