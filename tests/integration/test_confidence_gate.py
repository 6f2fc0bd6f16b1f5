"""The confidence gate on a real journal (both backends), with the scripted provider's exact votes:
3 of 5 diverts the tool to an approval, 4 of 5 runs it; approved it runs once, rejected it fails
`confidence_rejected` or follows a `low_confidence` edge; `onLow: fail`; shadow mode and an
estimator failure with `onError: proceed` journal a bypass; off journals nothing; an evaluation is
never taken twice. docs/anomalies.md, "The confidence gate"."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.core.confidence import GateMode
from pal.core.records import ClaimOutcome, Usage
from pal.engine.steps import execute_step
from tests.conftest import Backend
from tests.support.graphs import counted, edge
from tests.support.outbox import Outbox, capture_publishes, drain


def votes(yes: int, of: int = 5) -> list[dict[str, str]]:
    return [{"text": "yes"}] * yes + [{"text": "no"}] * (of - yes)


def gated(counter: Path, confidence: dict[str, Any], *, low_branch: bool = False) -> dict[str, Any]:
    """trigger -> act (a counted tool behind the gate) -> done; with `low_branch`, act's
    low_confidence edge leads to `fallback`."""
    act = counted("act", counter)
    act["data"]["confidence"] = confidence
    nodes = [{"id": "t", "type": "trigger"}, act, {"id": "done", "type": "output", "data": {"value": "acted"}}]
    edges = [edge("t", "act"), edge("act", "done")]
    if low_branch:
        nodes.append({"id": "fallback", "type": "output", "data": {"value": "held back"}})
        edges.append(edge("act", "fallback", "low_confidence"))
    return {"nodes": nodes, "edges": edges}


def gate_client(backend: Backend, mode: GateMode) -> Iterator[tuple[Client, Outbox]]:
    client = Client(backend.settings.with_(confidence_gate=mode))
    yield client, capture_publishes(client)
    client.close()


@pytest.fixture
def enforced(backend: Backend) -> Iterator[tuple[Client, Outbox]]:
    yield from gate_client(backend, GateMode.ENFORCE)


@pytest.fixture
def shadowed(backend: Backend) -> Iterator[tuple[Client, Outbox]]:
    yield from gate_client(backend, GateMode.SHADOW)


@pytest.fixture
def gate_off(backend: Backend) -> Iterator[tuple[Client, Outbox]]:
    yield from gate_client(backend, GateMode.OFF)


def events_of(client: Client, run_id: str, kind: str) -> list[Any]:
    return [e for e in client.events(run_id) if e.kind == kind]


def lines(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_three_of_five_diverts_to_an_approval_and_approved_it_runs_once(
        enforced: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = enforced
    run_id = client.start_run(gated(counter, {"samples": 5, "script": votes(3)}), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "waiting" and lines(counter) == 0  # the tool never ran
    [evaluated] = events_of(client, run_id, "confidence_evaluated")
    assert evaluated.step_id == "act"
    assert {k: evaluated.payload[k] for k in ("score", "threshold", "decision", "estimator", "samples")} == {
        "score": 0.6, "threshold": 0.75, "decision": "divert", "estimator": "self_consistency", "samples": 5}
    [pending] = client.pending_approvals(run_id)
    assert pending.kind == "confidence" and pending.show["score"] == 0.6
    assert pending.show["action"]["data"]["tool"] == "count"  # the action and its arguments are shown
    client.approve(run_id, "act", comment="checked by hand")
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "succeeded" and run.output == "acted" and lines(counter) == 1
    assert len(events_of(client, run_id, "confidence_evaluated")) == 1  # the run on never sampled again
    assert run.input_tokens > 0  # the gate's samples count in the run's totals
    assert client.runtime.journal.doctor.violations() == []


def test_four_of_five_runs_without_asking(enforced: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = enforced
    run_id = client.start_run(gated(counter, {"samples": 5, "script": votes(4)}), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded" and lines(counter) == 1
    [evaluated] = events_of(client, run_id, "confidence_evaluated")
    assert (evaluated.payload["score"], evaluated.payload["decision"]) == (0.8, "execute")
    assert events_of(client, run_id, "step_waiting") == []


def test_a_logprob_at_the_threshold_runs(enforced: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = enforced
    confidence = {"estimator": "logprob", "threshold": 0.5, "script": [{"text": "yes", "logprob": math.log(0.5)}]}
    run_id = client.start_run(gated(counter, confidence), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded" and lines(counter) == 1
    [evaluated] = events_of(client, run_id, "confidence_evaluated")
    assert evaluated.payload["score"] == pytest.approx(0.5) and evaluated.payload["samples"] == 1


def test_rejected_without_a_low_confidence_edge_the_run_fails(enforced: tuple[Client, Outbox],
                                                                counter: Path) -> None:
    client, outbox = enforced
    run_id = client.start_run(gated(counter, {"script": votes(1)}), {})
    drain(client, outbox)
    client.reject(run_id, "act", comment="no")
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "confidence_rejected" and lines(counter) == 0


def test_rejected_with_a_low_confidence_edge_the_run_follows_it(enforced: tuple[Client, Outbox],
                                                                  counter: Path) -> None:
    client, outbox = enforced
    run_id = client.start_run(gated(counter, {"script": votes(2)}, low_branch=True), {})
    drain(client, outbox)
    client.reject(run_id, "act")
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "succeeded" and run.output == "held back" and lines(counter) == 0
    completed = {e.step_id for e in events_of(client, run_id, "step_completed")}
    assert "fallback" in completed and "done" not in completed


def test_on_low_fail_fails_the_step_and_is_never_retried(enforced: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = enforced
    graph = gated(counter, {"script": votes(0), "onLow": "fail"})
    graph["nodes"][1]["data"]["retry"] = {"maxAttempts": 3, "retryableClasses": ["any"]}
    run_id = client.start_run(graph, {})
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["code"] == "low_confidence" and lines(counter) == 0
    assert events_of(client, run_id, "step_retrying") == []


def test_shadow_mode_scores_journals_a_bypass_and_never_blocks(shadowed: tuple[Client, Outbox],
                                                                counter: Path) -> None:
    client, outbox = shadowed
    run_id = client.start_run(gated(counter, {"script": votes(3)}), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded" and lines(counter) == 1
    assert events_of(client, run_id, "confidence_evaluated")[0].payload["decision"] == "divert"
    [bypass] = events_of(client, run_id, "confidence_gate_bypassed")
    assert bypass.payload == {"reason": "shadow", "score": 0.6, "mode": "shadow"}


@pytest.mark.parametrize(("on_error", "status", "ran"), [("divert", "waiting", 0), ("proceed", "succeeded", 1)])
def test_an_estimator_failure_counts_as_zero_unless_the_node_says_proceed(
        enforced: tuple[Client, Outbox], counter: Path, on_error: str, status: str, ran: int) -> None:
    client, outbox = enforced
    confidence = {"estimator": "verbalized", "onError": on_error, "script": [{"text": "who knows"}]}
    run_id = client.start_run(gated(counter, confidence), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == status and lines(counter) == ran
    [evaluated] = events_of(client, run_id, "confidence_evaluated")
    assert evaluated.payload["score"] == 0 and "stated no number" in evaluated.payload["error"]
    bypassed = [e.payload["reason"] for e in events_of(client, run_id, "confidence_gate_bypassed")]
    assert bypassed == ([] if on_error == "divert" else ["estimator_failed"])


def test_off_the_gate_journals_nothing(gate_off: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = gate_off
    run_id = client.start_run(gated(counter, {"script": votes(0)}), {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded" and lines(counter) == 1
    assert events_of(client, run_id, "confidence_evaluated") == []


def test_an_evaluation_is_never_journaled_twice(enforced: tuple[Client, Outbox], counter: Path) -> None:
    client, outbox = enforced
    run_id = client.start_run(gated(counter, {"script": votes(3)}), {})
    execute_step(client.runtime, *outbox.pop(0))  # the trigger
    [(_, step_id, generation)] = outbox
    fence = client.runtime.fence(run_id, generation)
    assert client.runtime.journal.steps.claim_step(fence, step_id).outcome is ClaimOutcome.RUN

    def evaluation(score: float, tokens: int) -> dict[str, Any]:
        return {"score": score, "threshold": 0.75, "decision": "execute" if score >= 0.75 else "divert",
                "estimator": "self_consistency", "samples": 5, "mode": "enforce",
                "usage": {"input_tokens": tokens, "output_tokens": 0, "cost_usd": "0"}}

    first = client.runtime.journal.confidence.record_confidence(fence, step_id, 1, evaluation(0.6, 7), Usage(7, 0))
    again = client.runtime.journal.confidence.record_confidence(fence, step_id, 1, evaluation(1.0, 9), Usage(9, 0))
    assert first["score"] == again["score"] == 0.6  # the first evaluation stands
    assert len(events_of(client, run_id, "confidence_evaluated")) == 1
    assert client.get_run(run_id).input_tokens == 7  # its usage counted once
