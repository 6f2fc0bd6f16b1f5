"""Invalid graphs and inputs are refused with their own message, and nothing is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pal.client import Client
from pal.errors import GraphError, InputError, RunIdReused
from pal.storage.database import create_engine
from pal.storage.schema import journal_events, run_locks, runs, side_effect_receipts
from tests.conftest import Backend
from tests.support.workers import in_process_worker

T = {"id": "t", "type": "trigger"}


def tool_node(node_id: str = "a", **data: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "tool", "data": {"tool": "echo", **data}}


def graph(*nodes: dict[str, Any], edges: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"nodes": list(nodes), "edges": edges if edges is not None else []}


def e(source: str, target: str, **extra: Any) -> dict[str, Any]:
    return {"source": source, "target": target, **extra}


BAD_GRAPHS: list[tuple[str, Any, str]] = [
    ("list", [1, 2], "graph must be an object"),
    ("no-nodes", {"edges": []}, "non-empty 'nodes' list"),
    ("node-not-object", graph(T, "a"), "node #1 must be an object"),
    ("bad-id", graph(T, {"id": "9 lives", "type": "trigger"}), "node #1 has invalid id '9 lives'"),
    ("duplicate-id", graph(T, tool_node("a"), tool_node("a"), edges=[e("t", "a")]), "node 'a': duplicate id"),
    ("unknown-type", graph(T, {"id": "a", "type": "teleport"}), "node 'a': unknown node type 'teleport'"),
    ("data-not-object", graph(T, {"id": "a", "type": "tool", "data": [1]}), "node 'a': 'data' must be an object"),
    ("unknown-field", graph(T, tool_node(colour="red"), edges=[e("t", "a")]), "unknown data field 'colour'"),
    ("missing-tool", graph(T, {"id": "a", "type": "tool", "data": {}}, edges=[e("t", "a")]),
     "node 'a': data field 'tool' is required"),
    ("wrong-type", graph(T, tool_node(args=[1]), edges=[e("t", "a")]), "data field 'args' must be object"),
    ("unknown-tool", graph(T, {"id": "a", "type": "tool", "data": {"tool": "nope"}}, edges=[e("t", "a")]),
     "unknown tool 'nope'"),
    ("no-trigger", graph(tool_node()), "missing trigger"),
    ("two-triggers", graph(T, {"id": "t2", "type": "trigger"}), "more than one trigger: t, t2"),
    ("edge-not-object", graph(T, tool_node(), edges=["t->a"]), "edge #0 must be an object"),
    ("dangling", graph(T, tool_node(), edges=[e("t", "a"), e("a", "ghost")]),
     "edge #1 (a -> ghost): dangling, no node with id 'ghost'"),
    ("self-loop", graph(T, tool_node(), edges=[e("t", "a"), e("a", "a")]), "a node cannot feed itself"),
    ("cycle", graph(T, tool_node("a"), tool_node("b"), edges=[e("t", "a"), e("a", "b"), e("b", "a")]),
     "cycle through a, b"),
    ("condition-no-handle",
     graph(T, {"id": "c", "type": "condition", "data": {"expression": "{{ input.x }}"}}, tool_node(),
           edges=[e("t", "c"), e("c", "a")]), "needs sourceHandle 'true' or 'false'"),
    ("handle-on-tool", graph(T, tool_node("a"), tool_node("b"),
                             edges=[e("t", "a"), e("a", "b", sourceHandle="true")]),
     "sourceHandle 'true' on a tool node"),
    ("into-trigger", graph(T, tool_node(), edges=[e("t", "a"), e("a", "t")]),
     "the trigger cannot have incoming edges"),
    ("unreachable", graph(T, tool_node("a"), tool_node("b"), edges=[e("t", "a")]),
     "node 'b': unreachable from the trigger"),
    ("template-syntax", graph(T, tool_node(args={"x": "{{ input.x "}), edges=[e("t", "a")]),
     "template syntax error"),
    ("template-name", graph(T, tool_node(args={"x": "{{ os.environ }}"}), edges=[e("t", "a")]),
     "unknown name(s) os"),
    ("template-ref-unknown", graph(T, tool_node(args={"x": "{{ nodes.zz.output }}"}), edges=[e("t", "a")]),
     "refers to unknown node 'zz'"),
    ("template-ref-downstream",
     graph(T, tool_node("a", args={"x": "{{ nodes.b.output }}"}), tool_node("b"),
           edges=[e("t", "a"), e("a", "b")]), "refers to node 'b', which does not run before it"),
    ("edges-not-list", {"nodes": [T], "edges": {"a": 1}}, "'edges' must be a list"),
    ("unknown-top-level", {"nodes": [T], "edgez": []}, "unknown top-level key 'edgez'"),
]


@pytest.fixture
def pg_client(postgres_backend: Backend) -> Client:
    return Client(postgres_backend.settings)


def row_counts(client: Client) -> dict[str, int]:
    with client.runtime.journal.engine.connect() as conn:
        return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in (runs, journal_events, run_locks, side_effect_receipts)}


def test_corpus_messages_are_distinct() -> None:
    messages = [m for _, _, m in BAD_GRAPHS]
    assert len(BAD_GRAPHS) >= 20
    assert len(set(messages)) == len(messages)


@pytest.mark.parametrize(("name", "document", "message"), BAD_GRAPHS, ids=[n for n, _, _ in BAD_GRAPHS])
def test_invalid_graph_is_refused_and_nothing_written(
    pg_client: Client, name: str, document: Any, message: str
) -> None:
    with pytest.raises(GraphError) as info:
        pg_client.start_run(document, {})
    assert message in str(info.value)
    assert row_counts(pg_client) == {"runs": 0, "journal_events": 0, "run_locks": 0,
                                     "side_effect_receipts": 0}


VALID = graph(T, tool_node(), edges=[e("t", "a")])

BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("set-input", {"run_input": {1, 2}}, "run input must be JSON"),
    ("nan-input", {"run_input": {"x": float("nan")}}, "run input must be JSON"),
    ("object-input", {"run_input": object()}, "run input must be JSON"),
    ("oversized-input", {"run_input": {"x": "y" * 2_000_000}}, "over the limit of 1000000"),
    ("bad-run-id", {"run_id": "has space"}, "run id 'has space' is invalid"),
    ("empty-run-id", {"run_id": ""}, "run id '' is invalid"),
    ("pipe-run-id", {"run_id": "a|b"}, "run id 'a|b' is invalid"),
]


@pytest.mark.parametrize(("name", "kwargs", "message"), BAD_INPUTS, ids=[n for n, _, _ in BAD_INPUTS])
def test_invalid_input_is_refused_and_nothing_written(
    pg_client: Client, name: str, kwargs: dict[str, Any], message: str
) -> None:
    run_input = kwargs.pop("run_input", {})
    with pytest.raises(InputError) as info:
        pg_client.start_run(VALID, run_input, **kwargs)
    assert message in str(info.value)
    assert sum(row_counts(pg_client).values()) == 0


def test_oversized_graph_is_refused(postgres_backend: Backend) -> None:
    client = Client(postgres_backend.settings.with_(max_graph_bytes=200))
    big = graph(T, tool_node(args={"blob": "x" * 500}), edges=[e("t", "a")])
    with pytest.raises(GraphError, match="over the limit of 200"):
        client.start_run(big, {})
    assert sum(row_counts(client).values()) == 0


def test_same_run_id_twice_returns_the_existing_run(pg_client: Client) -> None:
    first = pg_client.start_run(VALID, {"n": 1}, run_id="order-42")
    second = pg_client.start_run(VALID, {"n": 1}, run_id="order-42")
    assert first == second == "order-42"
    with pytest.raises(RunIdReused):  # the same id for other work: refused, not the old run
        pg_client.start_run(VALID, {"n": 2}, run_id="order-42")
    assert pg_client.get_run("order-42").input == {"n": 1}
    assert row_counts(pg_client)["runs"] == 1
    assert [ev.kind for ev in pg_client.events("order-42")] == ["run_queued"]


def pal(args: list[str], backend: Backend, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pal.cli", *args], env=backend.env(), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["run", "GRAPH", "--input", "{not json"], 2, "--input is not JSON"),
        (["run", "missing.json"], 2, "does not exist"),
        (["run", "BADGRAPH"], 2, "unknown node type 'teleport'"),
        (["run", "GRAPH", "--run-id", "no spaces please"], 2, "is invalid"),
        (["runs", "show", "run_nope"], 3, "no run 'run_nope'"),
        (["runs", "events", "run_nope"], 3, "no run 'run_nope'"),
        (["runs", "list", "--status", "sleeping"], 2, "unknown status 'sleeping'"),
        (["runs", "list", "--limit", "0"], 2, "Invalid value"),
        (["runs", "list", "--limit", "abc"], 2, "Invalid value"),
        (["run", "GRAPH", "--input", "DEEP"], 2, "more than 64 levels deep (PAL_MAX_JSON_DEPTH)"),
        (["run", "DEEPGRAPH"], 2, "nests too deeply"),
        (["runs", "approve", "run_nope", "gate"], 3, "no run 'run_nope'"),
        (["runs", "reject", "run_nope", "gate", "--comment", "x"], 3, "no run 'run_nope'"),
        (["runs", "approve"], 2, "Missing argument"),
        (["runs", "cancel", "run_nope"], 3, "no run 'run_nope'"),
        (["runs", "resume", "run_nope"], 3, "no run 'run_nope'"),
        (["runs", "approvals", "run_nope"], 3, "no run 'run_nope'"),
        (["tokens", "create", "--tenant", "bad!tenant"], 2, "tenant 'bad!tenant' is invalid"),
        (["tokens", "revoke", "tok_nope"], 3, "no live token 'tok_nope'"),
        (["doctor", "--json", "extra"], 2, "unexpected extra argument"),
        (["run", "GRAPH", "--limits", "{not json"], 2, "--limits is not JSON"),
        (["run", "GRAPH", "--limits", '{"maxTokens": -1}'], 2, "limits.maxTokens must be between 0"),
        (["run", "GRAPH", "--limits", '{"onBreach": "panic"}'], 2, "limits.onBreach must be one of"),
        (["anomalies", "--limit", "0"], 2, "Invalid value"),
    ],
)
def test_cli_refuses_bad_input_with_a_clear_message(
    postgres_backend: Backend, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "graph.json").write_text(json.dumps(VALID))
    (tmp_path / "bad.yaml").write_text("nodes:\n  - {id: t, type: trigger}\n  - {id: a, type: teleport}\n")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    args = [{"GRAPH": "graph.json", "BADGRAPH": "bad.yaml", "DEEPGRAPH": "deep.json",
             "DEEP": "[" * 100 + "]" * 100}.get(a, a) for a in args]
    result = pal(args, postgres_backend, tmp_path)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    engine = create_engine(postgres_backend.settings.database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 0
    engine.dispose()


def test_an_output_over_the_limits_fails_its_step_and_is_never_journaled(backend: Backend) -> None:
    settings = backend.settings.with_(max_output_bytes=2000, max_json_depth=8)
    client = Client(settings)
    big = graph(T, {"id": "a", "type": "tool", "data": {"tool": "blob", "args": {"size": 5000}}},
                edges=[e("t", "a")])
    deep = graph(T, {"id": "a", "type": "tool", "data": {"tool": "deep", "args": {"depth": 50}}},
                 edges=[e("t", "a")])
    small = graph(T, {"id": "a", "type": "tool", "data": {"tool": "blob", "args": {"size": 100}}},
                  edges=[e("t", "a")])
    with in_process_worker(client):
        runs_ = {name: client.wait(client.start_run(g, {}), timeout=60)
                 for name, g in (("big", big), ("deep", deep), ("small", small))}
    assert runs_["small"].status == "succeeded"
    assert runs_["big"].status == "failed" and runs_["big"].error["code"] == "output_too_large"
    assert "over the limit of 2000 (PAL_MAX_OUTPUT_BYTES)" in runs_["big"].error["message"]
    assert runs_["deep"].status == "failed" and "PAL_MAX_JSON_DEPTH" in runs_["deep"].error["message"]
    for name in ("big", "deep"):
        stored = json.dumps([ev.payload for ev in client.events(runs_[name].id)])
        assert "x" * 1000 not in stored and "[[[[[[[[[[" not in stored
    client.close()


def test_pal_run_with_a_run_id_of_other_work_exits_6_and_writes_nothing(postgres_backend: Backend,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "graph.json").write_text(json.dumps(VALID))
    first = pal(["run", "graph.json", "--run-id", "mine-1", "--input", '{"n": 1}', "--no-follow"],
                postgres_backend, tmp_path)
    assert first.returncode == 0, first.stderr
    again = pal(["run", "graph.json", "--run-id", "mine-1", "--input", '{"n": 1.0}', "--no-follow"],
                postgres_backend, tmp_path)
    assert again.returncode == 0 and "run mine-1 queued" in again.stdout  # the same request: idempotent
    other = pal(["run", "graph.json", "--run-id", "mine-1", "--input", '{"n": 2}', "--no-follow"],
                postgres_backend, tmp_path)
    assert other.returncode == 6 and "already a run of another graph or input" in other.stderr
    assert "Traceback" not in other.stderr


def test_pal_version_prints_the_installed_version(postgres_backend: Backend, tmp_path: Path) -> None:
    from importlib.metadata import version

    shown = pal(["--version"], postgres_backend, tmp_path)
    assert (shown.returncode, shown.stdout.strip()) == (0, f"pal {version('pal')}")


def test_tool_modules_are_found_in_the_folder_pal_runs_in(postgres_backend: Backend, tmp_path: Path) -> None:
    # The onboarding case: `PAL_TOOL_MODULES=myapp.tools` from the folder holding myapp/, with no
    # PYTHONPATH=. (the subprocess's PYTHONPATH holds only the checkout).
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tools.py").write_text(
        "import pal\n\n@pal.tool\ndef shout_here(text: str) -> str:\n    return text.upper()\n")
    graph = {"nodes": [{"id": "start", "type": "trigger"},
                       {"id": "s", "type": "tool", "data": {"tool": "shout_here", "args": {"text": "hi"}}}],
             "edges": [{"source": "start", "target": "s"}]}
    (tmp_path / "graph.json").write_text(json.dumps(graph))
    env = postgres_backend.env() | {"PAL_TOOL_MODULES": "myapp.tools"}
    assert str(tmp_path) not in env["PYTHONPATH"]
    # The installed `pal` script, not `python -m` (which puts the current folder on the path itself).
    script = str(Path(sys.executable).parent / "pal")
    started = subprocess.run([script, "run", "graph.json", "--no-follow"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and "queued" in started.stdout, started.stderr
    elsewhere = subprocess.run([script, "run", str(tmp_path / "graph.json"), "--no-follow"], env=env,
                               cwd=tmp_path.parent, capture_output=True, text=True, timeout=120)
    assert elsewhere.returncode != 0 and "cannot import tool module 'myapp.tools'" in elsewhere.stderr
