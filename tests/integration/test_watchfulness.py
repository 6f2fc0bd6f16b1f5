"""Anomalies and budgets on a real journal (both backends): a loop near its cap journals
`runaway_loop` once; a budget in `fail` stops the run before the step past it runs; in `warn` it
journals an anomaly and the run goes on; a run's own limits override the graph's; a malformed block
is refused with nothing written; an anomaly is never journaled twice, whoever reports it again.
docs/anomalies.md."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pal.client import Client
from pal.core.anomalies import MIN_BASELINE_SAMPLES, Anomaly, AnomalyKind
from pal.core.records import Fence
from pal.engine.steps import execute_step
from pal.errors import GraphError, InputError
from pal.storage.journal import Journal
from pal.workers.beat import schedule_of
from tests.conftest import Backend
from tests.support.graphs import edge, linear, loop, single
from tests.support.outbox import Outbox, capture_publishes, drain


@pytest.fixture
def outbox(client: Client) -> Outbox:
    return capture_publishes(client)


def kinds(client: Client, run_id: str, kind: str) -> list[Any]:
    return [e for e in client.events(run_id) if e.kind == kind]


def anomalies_of(client: Client, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.payload["kind"], e.step_id) for e in kinds(client, run_id, "anomaly_detected")]


def lines(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_a_loop_near_its_cap_journals_runaway_loop_once(client: Client, outbox: Outbox, counter: Path) -> None:
    run_id = client.start_run(loop(counter, max_iterations=10), {"items": list(range(9))})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"  # informational: the run goes on
    assert anomalies_of(client, run_id) == [("runaway_loop", "each")]
    [event] = kinds(client, run_id, "anomaly_detected")
    assert event.payload["observed"] == 8 and event.payload["limit"] == 8.0 and event.payload["basis"] == "static"
    assert [a["kind"] for a in client.anomalies(run_id)] == ["runaway_loop"]
    assert client.runtime.journal.doctor.violations() == []


def test_a_loop_well_under_its_cap_journals_nothing(client: Client, outbox: Outbox, counter: Path) -> None:
    run_id = client.start_run(loop(counter, max_iterations=10), {"items": list(range(7))})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    assert anomalies_of(client, run_id) == [] and client.anomalies(run_id) == []


def test_a_budget_in_fail_stops_the_run_before_the_step_past_it(client: Client, outbox: Outbox,
                                                                 counter: Path) -> None:
    graph = linear(counter, 6) | {"limits": {"maxSteps": 3, "onBreach": "fail"}}
    run_id = client.start_run(graph, {})
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "failed"
    assert run.error["code"] == "budget_exceeded" and run.error["limit_name"] == "maxSteps"
    assert (run.error["limit"], run.error["observed"]) == ("3", "3")
    assert len(kinds(client, run_id, "step_completed")) == 3
    [failed] = kinds(client, run_id, "step_failed")
    assert lines(counter) == 2  # trigger + two counted nodes ran; the fourth step's node never did
    assert failed.step_id not in {e.step_id for e in kinds(client, run_id, "step_completed")}
    assert client.runtime.journal.doctor.violations() == []


def test_a_token_budget_counts_what_model_steps_spent(client: Client, outbox: Outbox) -> None:
    def ask(node_id: str) -> dict[str, Any]:
        return {"id": node_id, "type": "ai-step", "data": {"provider": "scripted", "model": "m",
                                                           "prompt": "say {{ input.text }}"}}
    graph = {"nodes": [{"id": "t", "type": "trigger"}, ask("a"), ask("b"), ask("c")],
             "edges": [edge("t", "a"), edge("a", "b"), edge("b", "c")],
             "limits": {"maxTokens": 10, "onBreach": "fail"}}
    run_id = client.start_run(graph, {"text": "one two three four five six seven"})
    drain(client, outbox)
    run = client.get_run(run_id)
    assert run.status == "failed" and run.error["limit_name"] == "maxTokens"
    spent = run.input_tokens + run.output_tokens
    assert spent >= 10 and int(run.error["observed"]) == spent  # the step that crossed the line, no more
    assert [e.step_id for e in kinds(client, run_id, "step_completed")] == ["t", "a"]


def test_a_budget_in_warn_journals_an_anomaly_and_goes_on(client: Client, outbox: Outbox, counter: Path) -> None:
    graph = linear(counter, 4) | {"limits": {"maxSteps": 2}}
    run_id = client.start_run(graph, {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    assert anomalies_of(client, run_id) == [("excessive_steps", None)]  # once, not once per step
    assert kinds(client, run_id, "anomaly_detected")[0].payload["message"].startswith("budget:")


def test_a_runs_own_limits_override_the_graphs(client: Client, outbox: Outbox, counter: Path) -> None:
    graph = linear(counter, 6) | {"limits": {"maxSteps": 100, "onBreach": "fail"}}
    run_id = client.start_run(graph, {}, limits={"maxSteps": 2})
    drain(client, outbox)
    assert client.get_run(run_id).limits == {"maxSteps": 2}
    assert client.get_run(run_id).error["limit_name"] == "maxSteps"
    assert len(kinds(client, run_id, "step_completed")) == 2


@pytest.mark.parametrize(("where", "block", "fragment"), [
    ("run", {"maxTokens": -1}, "limits.maxTokens must be between 0"),
    ("run", {"onBreach": "explode"}, "limits.onBreach must be one of warn, fail, pause"),
    ("run", ["maxTokens"], "limits must be an object"),
    ("graph", {"maxSteps": "many"}, "limits.maxSteps must be a number"),
    ("anomalies", {"maxRetries": 0}, "anomalies.maxRetries must be a positive number"),
])
def test_a_malformed_block_is_refused_and_nothing_is_written(client: Client, outbox: Outbox, counter: Path,
                                                            where: str, block: Any, fragment: str) -> None:
    graph = linear(counter, 2)
    if where == "graph":
        graph["limits"] = block
    if where == "anomalies":
        graph["anomalies"] = block
    with pytest.raises(InputError if where == "run" else GraphError, match=r"limits|anomalies") as caught:
        client.start_run(graph, {}, limits=block if where == "run" else None)
    assert fragment in str(caught.value)
    assert client.list_runs() == [] and outbox == []


def test_an_anomaly_is_journaled_once_whoever_reports_it_again(client: Client, outbox: Outbox,
                                                               counter: Path) -> None:
    run_id = client.start_run(loop(counter, max_iterations=10), {"items": list(range(9))})
    for _ in range(100):  # run until the anomaly is journaled, leaving the run in flight
        execute_step(client.runtime, *outbox.pop(0))
        if anomalies_of(client, run_id):
            break
    lease = client.runtime.journal.runs.get_lease(run_id)
    assert lease is not None and client.get_run(run_id).status == "running"
    # Another process (no cache of what was journaled) reports it again, as a re-drive after a
    # crash would: the database refuses the second row, and no second event is appended.
    other = Journal(client.runtime.journal.engine)
    fence = Fence(run_id, lease.generation, "w2", datetime.now(UTC), 30)
    again = Anomaly(AnomalyKind.RUNAWAY_LOOP, 9, 8.0, "static", "each", "again")
    new = Anomaly(AnomalyKind.RETRY_STORM, 11, 10, "static", None, "a storm")
    assert other.anomalies.record_anomalies(fence, [again, new]) == [new]
    assert other.anomalies.record_anomalies(fence, [again, new]) == []
    assert anomalies_of(client, run_id) == [("runaway_loop", "each"), ("retry_storm", None)]
    drain(client, outbox)
    assert anomalies_of(client, run_id) == [("runaway_loop", "each"), ("retry_storm", None)]
    assert client.runtime.journal.doctor.violations() == []


def test_pal_anomalies_lists_them(postgres_backend: Backend, counter: Path, tmp_path: Path) -> None:
    client = Client(postgres_backend.settings)
    sent = capture_publishes(client)
    run_id = client.start_run(loop(counter, max_iterations=10), {"items": list(range(9))})
    drain(client, sent)
    client.close()
    for args in (["anomalies", "--json"], ["runs", "anomalies", run_id, "--json"]):
        shown = subprocess.run([sys.executable, "-m", "pal.cli", *args], env=postgres_backend.env(),
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        [listed] = json.loads(shown.stdout)
        assert (listed["run_id"], listed["kind"], listed["step_id"]) == (run_id, "runaway_loop", "each")
    plain = subprocess.run([sys.executable, "-m", "pal.cli", "anomalies"], env=postgres_backend.env(),
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "runaway_loop" in plain.stdout and run_id in plain.stdout


def test_a_model_asking_for_the_same_tool_call_a_third_time_is_a_runaway_loop(
        client: Client, outbox: Outbox) -> None:
    same = {"tool_calls": [{"name": "echo", "arguments": {"order": 7}}]}
    other = {"tool_calls": [{"name": "echo", "arguments": {"order": 8}}]}
    spec = {"kind": "llm", "provider": "scripted", "model": "m", "prompt": "where is my order?",
            "tools": ["echo"], "maxTurns": 6, "script": [same, other, same, same, same, {"text": "done"}]}
    run_id = client.start_run(spec, {})
    drain(client, outbox)
    assert client.get_run(run_id).status == "succeeded"
    # the third identical call is in turn 4 (turn 2 asked for another order); the fourth is not new
    assert anomalies_of(client, run_id) == [("runaway_loop", "turn-4.tool-0")]


def ask_graph() -> dict[str, Any]:
    """trigger -> ask: one model step whose tokens grow with the input's text."""
    return {"nodes": [{"id": "t", "type": "trigger"},
                      {"id": "ask", "type": "ai-step", "data": {"provider": "scripted", "model": "m",
                                                                "prompt": "{{ input.text }}"}}],
            "edges": [edge("t", "ask")]}


def test_a_step_far_above_its_nodes_baseline_is_a_token_spike(client: Client, outbox: Outbox) -> None:
    """20 runs make the node's baseline (recomputed as the beat task does); a 21st whose model step
    spends far more tokens journals token_spike on that step, once."""
    graph = ask_graph()
    usual = [client.start_run(graph, {"text": f"short question {i}"}) for i in range(MIN_BASELINE_SAMPLES)]
    drain(client, outbox)
    # tokens and cost of `ask`, the retries of `t` and `ask`, and the graph's steps per run
    assert client.runtime.journal.baselines.recompute_baselines(now=datetime.now(UTC)) == 5
    graph_hash = client.get_run(usual[0]).graph_hash or ""
    assert set(client.runtime.journal.baselines.baselines(client.settings.tenant, graph_hash)) == {
        ("ask", "tokens"), ("ask", "cost_usd"), ("t", "retries"), ("ask", "retries"), ("*", "steps")}
    assert all(anomalies_of(client, run_id) == [] for run_id in usual)
    worker = Client(client.settings)  # a worker process started after the beat task's pass
    sent = capture_publishes(worker)
    spiking = worker.start_run(graph, {"text": " ".join(["word"] * 400)})
    calm = worker.start_run(graph, {"text": "short question again"})
    drain(worker, sent)
    worker.close()
    assert anomalies_of(client, spiking) == [("token_spike", "ask")]
    [event] = kinds(client, spiking, "anomaly_detected")
    assert event.payload["basis"] == "baseline" and event.payload["observed"] > event.payload["limit"]
    assert anomalies_of(client, calm) == []
    assert client.get_run(spiking).status == "succeeded"  # informational


def test_each_tenant_is_judged_by_its_own_baselines(client: Client, outbox: Outbox) -> None:
    """Two tenants run the same graph: acme with short prompts, then globex with long ones. Each
    gets its own baselines; globex, before it has any, is not judged by acme's, and its long prompts
    never move acme's: a long prompt is still acme's spike and still globex's usual."""
    graph = ask_graph()
    long_text = " ".join(["word"] * 400)
    journal = client.runtime.journal

    def run_as(tenant: str, *texts: str) -> list[str]:
        worker = Client(client.settings)  # a worker process started after the beat task's last pass
        sent = capture_publishes(worker)
        run_ids = [worker.start_run(graph, {"text": text}, tenant_id=tenant) for text in texts]
        drain(worker, sent)
        worker.close()
        return run_ids

    acme_usual = run_as("acme", *(f"short question {i}" for i in range(MIN_BASELINE_SAMPLES)))
    assert journal.baselines.recompute_baselines(now=datetime.now(UTC)) == 5
    graph_hash = client.get_run(acme_usual[0]).graph_hash or ""
    acme_alone = journal.baselines.baselines("acme", graph_hash)
    assert len(acme_alone[("ask", "tokens")]) == MIN_BASELINE_SAMPLES
    assert journal.baselines.baselines("globex", graph_hash) == {}
    [globex_first] = run_as("globex", long_text)
    assert anomalies_of(client, globex_first) == []  # acme's usual is not globex's

    run_as("globex", *[long_text] * MIN_BASELINE_SAMPLES)
    assert journal.baselines.recompute_baselines(now=datetime.now(UTC)) == 10
    assert journal.baselines.baselines("acme", graph_hash) == acme_alone  # globex's usage moved nothing of acme's
    globex = journal.baselines.baselines("globex", graph_hash)
    assert len(globex[("ask", "tokens")]) == MIN_BASELINE_SAMPLES + 1
    assert min(globex[("ask", "tokens")]) > max(acme_alone[("ask", "tokens")])
    [acme_spike] = run_as("acme", long_text)
    [globex_usual] = run_as("globex", long_text)
    assert anomalies_of(client, acme_spike) == [("token_spike", "ask")]
    assert anomalies_of(client, globex_usual) == []


def test_no_baseline_before_enough_samples(client: Client, outbox: Outbox) -> None:
    graph = ask_graph()
    for i in range(MIN_BASELINE_SAMPLES - 1):
        client.start_run(graph, {"text": f"short question {i}"})
    drain(client, outbox)
    client.runtime.journal.baselines.recompute_baselines(now=datetime.now(UTC))
    worker = Client(client.settings)
    sent = capture_publishes(worker)
    spiking = worker.start_run(graph, {"text": " ".join(["word"] * 400)})
    drain(worker, sent)
    worker.close()
    assert anomalies_of(client, spiking) == []


def test_beat_recomputes_the_baselines_through_a_named_task(client: Client) -> None:
    schedule = schedule_of(client.settings.with_(baseline_interval=120.0))
    entry = schedule["pal-recompute-baselines"]
    assert (entry["task"], entry["schedule"]) == ("pal.recompute_baselines", 120.0)
    assert client.app.tasks["pal.recompute_baselines"].apply().get() == 0  # nothing spent yet


def test_a_run_far_past_its_graphs_usual_step_count_is_excessive_steps(client: Client, outbox: Outbox,
                                                                        counter: Path) -> None:
    """20 succeeded runs of a loop over 2 items make the graph's step-count baseline (as the beat
    task does); a run over 20 items completes more than 3x their median and journals
    excessive_steps on the baseline basis, once."""
    graph = loop(counter, max_iterations=100)
    for _ in range(MIN_BASELINE_SAMPLES):
        client.start_run(graph, {"items": [1, 2]})
    drain(client, outbox)
    client.runtime.journal.baselines.recompute_baselines(now=datetime.now(UTC))
    worker = Client(client.settings)  # a worker process started after the beat task's pass
    sent = capture_publishes(worker)
    long_run = worker.start_run(graph, {"items": list(range(20))})
    usual_run = worker.start_run(graph, {"items": [3, 4]})
    drain(worker, sent)
    worker.close()
    assert anomalies_of(client, long_run) == [("excessive_steps", None)]
    [event] = kinds(client, long_run, "anomaly_detected")
    assert event.payload["basis"] == "baseline" and "usually finish in" in event.payload["message"]
    assert anomalies_of(client, usual_run) == []
    assert client.get_run(long_run).status == "succeeded"  # informational


def test_a_node_retrying_far_above_its_usual_is_a_retry_storm(client: Client, outbox: Outbox,
                                                             tmp_path: Path) -> None:
    """20 runs where `work` never retries make its baseline; a run where it retries 4 times
    journals retry_storm on `work` (baseline basis, once), one that retries twice does not."""
    flaky_calls = tmp_path / "flaky.log"
    graph = {"nodes": [{"id": "t", "type": "trigger"},
                       {"id": "work", "type": "tool",
                        "data": {"tool": "flaky", "retry": {"maxAttempts": 6, "retryableClasses": ["any"]},
                                 "args": {"path": str(flaky_calls), "label": "{{ input.label }}",
                                          "failures": "{{ input.failures }}"}}}],
             "edges": [edge("t", "work")]}
    for i in range(MIN_BASELINE_SAMPLES):
        client.start_run(graph, {"label": f"calm-{i}", "failures": 0})
    drain(client, outbox)
    client.runtime.journal.baselines.recompute_baselines(now=datetime.now(UTC))
    worker = Client(client.settings)  # a worker process started after the beat task's pass
    sent = capture_publishes(worker)
    stormy = worker.start_run(graph, {"label": "stormy", "failures": 4})
    bumpy = worker.start_run(graph, {"label": "bumpy", "failures": 2})
    drain(worker, sent)
    worker.close()
    assert anomalies_of(client, stormy) == [("retry_storm", "work")]
    [event] = kinds(client, stormy, "anomaly_detected")
    assert event.payload["basis"] == "baseline" and event.payload["observed"] == 3  # at the 4th attempt's claim
    assert anomalies_of(client, bumpy) == []
    assert client.get_run(stormy).status == "succeeded"  # informational


def test_a_loops_iterations_share_their_body_nodes_baseline(client: Client, outbox: Outbox) -> None:
    """Ten runs of two iterations give `each[*].ask` 20 samples (no single iteration index has
    that many); a later run whose second item is far longer journals token_spike on that step."""
    graph = single({"id": "each", "type": "loop", "data": {
        "items": "{{ input.items }}",
        "body": {"nodes": [{"id": "ask", "type": "ai-step",
                            "data": {"provider": "scripted", "model": "m", "prompt": "{{ loop.item }}"}}],
                 "edges": []}}})
    for i in range(MIN_BASELINE_SAMPLES // 2):
        client.start_run(graph, {"items": [f"short one {i}", f"short two {i}"]})
    drain(client, outbox)
    client.runtime.journal.baselines.recompute_baselines(now=datetime.now(UTC))
    worker = Client(client.settings)
    sent = capture_publishes(worker)
    spiking = worker.start_run(graph, {"items": ["short again", " ".join(["word"] * 400)]})
    drain(worker, sent)
    worker.close()
    assert anomalies_of(client, spiking) == [("token_spike", "each[1].ask")]
