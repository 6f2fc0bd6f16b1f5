"""The approval commands from separate `pal` processes, on both journals: what waits is shown in full
(prompt, `show`, hash, the commands that decide it), per run and tenant-wide (never another
tenant's); `pal run` prints it when its run parks and follows the run to its end once someone else
decides; the decision's inputs are bounded; `pal runs show` prints a failed step's traceback."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import Backend
from tests.support.graphs import approval, failing
from tests.support.workers import in_process_worker


def pal(backend: Backend, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pal.cli", *args], env=backend.env() | env,
                          capture_output=True, text=True, timeout=120)


def parked(client: Client, tmp_path: Path, run_id: str, amount: int = 5, tenant: str | None = None) -> str:
    client.start_run(approval(tmp_path / "c"), {"amount": amount, "customer": "ada"}, run_id=run_id,
                     tenant_id=tenant)
    return run_id


def decided(client: Client, run_id: str) -> list[dict[str, object]]:
    return [e.payload for e in client.events(run_id) if e.kind == "approval_decided"]


def test_runs_approvals_shows_prompt_show_hash_and_the_commands(backend: Backend, client: Client,
                                                                 tmp_path: Path) -> None:
    run_id = parked(client, tmp_path, "gate-a", amount=5)
    with in_process_worker(client):
        assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
    [pending] = client.pending_approvals(run_id)
    shown = pal(backend, "runs", "approvals", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"run {run_id} step gate waits for a decision" in out and "prompt: Refund 5 to ada?" in out
    show_json = json.dumps(pending.show, indent=2).splitlines()
    assert pending.show and all(f"    {line}" in out.splitlines() for line in show_json)
    assert f"hash: {pending.approval_hash}" in out
    assert f"pal runs approve {run_id} gate --hash {pending.approval_hash}" in out
    assert f"pal runs reject {run_id} gate" in out
    as_json = json.loads(pal(backend, "runs", "approvals", run_id, "--json").stdout)
    assert as_json == [pending.as_dict()] and as_json[0]["show"] == pending.show
    missing = pal(backend, "runs", "approvals", "run_nope")
    assert missing.returncode == 3


def test_tenant_wide_approvals_list_only_that_tenants(backend: Backend, client: Client, tmp_path: Path) -> None:
    ours, theirs = parked(client, tmp_path, "gate-ours"), parked(client, tmp_path, "gate-theirs", tenant="globex")
    with in_process_worker(client):
        assert wait_until(lambda: all(client.get_run(r).status == "waiting" for r in (ours, theirs)), timeout=60)
    mine = json.loads(pal(backend, "approvals", "--json").stdout)  # PAL_TENANT unset: "default"
    assert [(p["run_id"], p["step_id"]) for p in mine] == [(ours, "gate")]
    assert mine[0]["show"] == client.pending_approvals(ours)[0].show
    other = json.loads(pal(backend, "approvals", "--tenant", "globex", "--json").stdout)
    assert [p["run_id"] for p in other] == [theirs]
    as_globex = pal(backend, "approvals", PAL_TENANT="globex")
    assert as_globex.returncode == 0 and theirs in as_globex.stdout and ours not in as_globex.stdout
    assert "prompt: Refund 5 to ada?" in as_globex.stdout
    nobody = pal(backend, "approvals", "--tenant", "initech")
    assert nobody.returncode == 0 and nobody.stdout.strip() == "no pending approvals for tenant initech"


def test_tenant_wide_approvals_refuse_a_bad_tenant_or_limit(sqlite_backend: Backend) -> None:
    # A bad argument is refused alike on either backend, so one of them is enough.
    for bad in ("../etc", "x" * 65, "", "a b", "tenant\n"):
        refused = pal(sqlite_backend, "approvals", "--tenant", bad)
        assert refused.returncode == 2 and "invalid" in refused.stderr, bad
    for bad_limit in ("0", "501", "many"):
        assert pal(sqlite_backend, "approvals", "--limit", bad_limit).returncode == 2


def test_oversized_decisions_are_refused_and_nothing_is_written(backend: Backend, client: Client,
                                                                tmp_path: Path) -> None:
    run_id = parked(client, tmp_path, "gate-big")
    with in_process_worker(client):
        assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=60)
        before = len(client.events(run_id))
        long_comment = pal(backend, "runs", "approve", run_id, "gate", "--comment", "x" * 2001)
        assert long_comment.returncode == 2 and "at most 2000 characters" in long_comment.stderr
        long_by = pal(backend, "runs", "reject", run_id, "gate", "--by", "y" * 201)
        assert long_by.returncode == 2
        assert len(client.events(run_id)) == before and client.get_run(run_id).status == "waiting"
        ok = pal(backend, "runs", "approve", run_id, "gate", "--comment", "z" * 2000, "--by", "ada")
        assert ok.returncode == 0, ok.stderr
        assert client.wait(run_id, timeout=60).status == "succeeded"
    [payload] = decided(client, run_id)
    assert (payload["by"], payload["comment"], payload["decision"]) == ("ada", "z" * 2000, "approved")


def test_pal_run_prints_the_approval_and_follows_the_run_after_a_decision(
        backend: Backend, client: Client, tmp_path: Path) -> None:
    graph = tmp_path / "gate.json"
    graph.write_text(json.dumps(approval(tmp_path / "c")))
    follower = subprocess.Popen(
        [sys.executable, "-m", "pal.cli", "run", str(graph), "--input", '{"amount": 7, "customer": "bo"}',
         "--run-id", "gate-run", "--timeout", "120"],
        env=backend.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in follower.stdout or ()],
                              daemon=True)
    reader.start()
    seen: list[str] = []

    def printed(text: str) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return any(text in line for line in seen)

    with in_process_worker(client):
        # Whoever runs `pal run` is told what to decide and how, while it keeps waiting.
        assert wait_until(lambda: printed("pal runs reject gate-run gate"), timeout=60), seen
        assert follower.poll() is None
        [pending] = client.pending_approvals("gate-run")
        assert printed("prompt: Refund 7 to bo?") and printed(f"hash: {pending.approval_hash}")
        assert printed(f"approve: pal runs approve gate-run gate --hash {pending.approval_hash}")
        # Decided from another process, with exactly the command printed; the follower carries on.
        command = next(line for line in seen if "approve: pal runs approve" in line).split("approve: pal ", 1)[1]
        decision = pal(backend, *command.split(), "--comment", "checked the amount", "--by", "ops")
        assert decision.returncode == 0, decision.stderr
        assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
    reader.join(timeout=30)
    printed("")
    text = "\n".join(seen)
    assert "approval_decided gate approved by ops" in text and "checked the amount" in text
    assert "step_completed pay" in text and text.rstrip().endswith("run gate-run succeeded")
    assert sum("waits for a decision" in line for line in seen) == 1  # printed once


def test_pal_run_timing_out_while_the_run_waits_for_a_person_says_so(backend: Backend, client: Client,
                                                                     tmp_path: Path) -> None:
    graph = tmp_path / "gate.json"
    graph.write_text(json.dumps(approval(tmp_path / "c")))
    parked(client, tmp_path, "gate-t", amount=1)
    with in_process_worker(client):
        assert wait_until(lambda: client.get_run("gate-t").status == "waiting", timeout=60)
        # The same id, graph and input: `pal run` follows the parked run until its timeout.
        ran = pal(backend, "run", str(graph), "--input", '{"amount": 1, "customer": "ada"}', "--run-id", "gate-t",
                  "--timeout", "1")
    assert ran.returncode == 5
    assert "still waits for a person's decision" in ran.stderr and "pal runs approvals gate-t" in ran.stderr
    assert "worker" not in ran.stderr


def test_runs_show_prints_the_error_traceback_and_steps(backend: Backend, client: Client) -> None:
    with in_process_worker(client):
        run_id = client.start_run(failing(), {})
        assert client.wait(run_id, timeout=60).status == "failed"
    shown = pal(backend, "runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "RuntimeError" in shown.stdout and "      traceback:" in shown.stdout and "in explode" in shown.stdout
    assert "    RuntimeError: kaput" in shown.stdout and "cost_usd: 0\n" in shown.stdout
    assert any(line.split() == ["bad", "failed", "1", "RuntimeError:", "kaput"] for line in shown.stdout.splitlines())
    as_json = json.loads(pal(backend, "runs", "show", run_id, "--json").stdout)
    assert as_json["error"]["traceback"].rstrip().endswith("RuntimeError: kaput") and as_json["cost_usd"] == "0"
