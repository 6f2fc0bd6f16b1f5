"""Crash-resume of watchfulness under real SIGKILL: a `pal worker` dies right after a claim's
`anomaly_detected` committed (before the step's node ran); a fresh worker and the beat-driven sweep
finish the run with the anomaly journaled exactly once and every tool run once (docs/anomalies.md)."""

from __future__ import annotations

import signal
from pathlib import Path

from pal.client import Client
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import assert_exactly_once
from tests.support.graphs import counted, linear
from tests.support.processes import Processes
from tests.support.servers import FakeModelServer
from tests.support.tools import calls


def test_worker_killed_after_an_anomaly_commit_leaves_exactly_one(
    processes: Processes, postgres_backend: Backend, tmp_path: Path
) -> None:
    counter = tmp_path / "calls.log"
    doomed = processes.worker("doomed", PAL_FAULT_POINT="after_anomaly_commit:s0",
                              PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
    client = Client(postgres_backend.settings)
    # maxSteps 1 in `warn`: the claim of s0 (after the trigger completed) journals excessive_steps.
    run_id = client.start_run(linear(counter, 3) | {"limits": {"maxSteps": 1}}, {})
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL and (tmp_path / "fired").exists()
    assert [e.payload["kind"] for e in client.events(run_id) if e.kind == "anomaly_detected"] == [
        "excessive_steps"]
    assert calls(counter) == []  # killed before s0's node ran
    processes.worker("fresh")
    processes.beat()
    assert client.wait(run_id, timeout=120).status == "succeeded"
    assert_exactly_once(client, run_id)
    assert [e.payload["kind"] for e in client.events(run_id) if e.kind == "anomaly_detected"] == [
        "excessive_steps"]
    assert sorted(calls(counter)) == ["s0", "s1", "s2"]  # each tool once
    client.close()


def test_worker_killed_after_a_confidence_commit_never_samples_again(
    processes: Processes, postgres_backend: Backend, tmp_path: Path
) -> None:
    counter = tmp_path / "calls.log"
    with FakeModelServer(script=[{"text": "yes"}]) as judge:  # every sample says yes: score 1.0
        processes.common |= {"PAL_OPENAI_BASE_URL": judge.openai_base_url, "OPENAI_API_KEY": "sk-test",
                             "PAL_CONFIDENCE_GATE": "enforce"}
        doomed = processes.worker("doomed", PAL_FAULT_POINT="after_confidence_commit:act",
                                  PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"))
        client = Client(postgres_backend.settings)
        act = counted("act", counter)
        act["data"]["confidence"] = {"provider": "openai", "model": "gpt-4o-mini", "samples": 3}
        run_id = client.start_run({"nodes": [{"id": "t", "type": "trigger"}, act],
                                   "edges": [{"source": "t", "target": "act"}]}, {})
        doomed.wait(timeout=120)
        assert doomed.returncode == -signal.SIGKILL and (tmp_path / "fired").exists()
        sampled = judge.requests_to("/v1/chat/completions")
        assert len(sampled) == 3 and calls(counter) == []  # scored and journaled; the tool never ran
        processes.worker("fresh")
        processes.beat()
        assert client.wait(run_id, timeout=120).status == "succeeded"
        assert_exactly_once(client, run_id)
        [evaluated] = [e for e in client.events(run_id) if e.kind == "confidence_evaluated"]
        assert (evaluated.payload["score"], evaluated.payload["decision"]) == (1.0, "execute")
        assert len(judge.requests_to("/v1/chat/completions")) == 3  # the re-drive read the score back
        assert len({r.headers.get("idempotency-key") for r in sampled}) == 3  # a key per sample
        assert calls(counter) == ["act"]
        client.close()
