"""The layer contract (docs/architecture.md, "The map"), read from the source's own imports.

Every `import pal...` and `from pal... import` in src/pal is checked, wherever it stands: a module
may import only its own layer and the layers its row allows, no import may close a circle, and a
`pal` import inside a function is allowed only where the contract says (the CLI's lazy loading).
A change that breaks a rule fails here, naming the file, the line and the rule.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# layer -> the layers it may import (besides itself). The order is the house, top floor first.
ALLOWED: dict[str, frozenset[str]] = {
    "pal": frozenset({"client", "errors", "tools", "workers"}),
    "cli": frozenset({"client", "api", "workers", "engine", "storage", "plan", "nodes", "providers",
                      "tools", "config", "core", "errors"}),
    "client": frozenset({"workers", "engine", "storage", "plan", "nodes", "providers", "tools",
                         "config", "core", "errors"}),
    "api": frozenset({"workers", "engine", "storage", "plan", "nodes", "providers", "tools", "config",
                      "core", "errors"}),
    "workers": frozenset({"engine", "storage", "plan", "nodes", "providers", "tools", "config", "core",
                          "errors"}),
    "engine": frozenset({"storage", "plan", "nodes", "providers", "tools", "vms", "config", "core", "errors"}),
    "plan": frozenset({"nodes", "providers", "tools", "config", "core", "errors"}),
    "storage": frozenset({"config", "core", "errors"}),
    "nodes": frozenset({"providers", "tools", "config", "core", "errors"}),
    "providers": frozenset({"config", "core", "errors"}),
    "tools": frozenset({"config", "core", "errors"}),
    "vms": frozenset({"config", "core", "errors"}),  # VM drivers (the isolated tier)
    # A VM's supervisor: it builds its sandbox with the host-side VM code and talks to the control
    # plane over HTTP only (never storage or the engine).
    "harness": frozenset({"vms", "config", "core", "errors"}),
    "sdk": frozenset(),  # runs inside the sandbox: the standard library only
    "config": frozenset({"core", "errors"}),
    "core": frozenset({"errors"}),
    "errors": frozenset(),
}
# Where a function-level `pal` import is part of the design: the CLI loads a command's machinery
# only when that command runs, so `pal --help` stays fast; a provider's module loads its optional
# SDK (openai, anthropic) only when a run asks for that provider; the package's face loads the
# public names on first use, the API package its FastAPI app (so Flower alone needs no FastAPI), and
# the workers package its default app (`celery -A pal.workers`), which only a process PAL runs needs.
LAZY_IMPORTS_ALLOWED = ("pal.cli.",)
LAZY_MODULES = {"pal": ("pal.client", "pal.tools", "pal.workers.install"),
                "pal.providers": ("pal.providers.openai_api", "pal.providers.anthropic_api"),
                "pal.api": ("pal.api.app",),
                "pal.workers": ("pal.config", "pal.core.redact", "pal.workers.pal_app")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pal"


def pal_imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, int, bool]]:
    """(imported pal module, line, inside a function) for every pal import of one file."""
    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == "pal" or alias.name.startswith("pal."):
                        yield alias.name, child.lineno, in_function
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                if base == "pal" or base.startswith("pal."):
                    for alias in child.names:  # `from pal.x import y` may name the module pal.x.y
                        candidate = f"{base}.{alias.name}"
                        yield (candidate if known(candidate) else base), child.lineno, in_function
            yield from walk(child, inner)
    yield from walk(tree, False)


def known(module: str) -> bool:
    rel = Path(*module.split("."))
    return (SRC / rel).with_suffix(".py").exists() or (SRC / rel / "__init__.py").exists()


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "pal").rglob("*.py")) if "migrations" not in p.parts}


def imports_of_house() -> dict[str, list[tuple[str, int, bool]]]:
    found = {}
    for module, path in sources().items():
        tree = ast.parse(path.read_text(), str(path))
        found[module] = list(pal_imports(tree, module, path.name == "__init__.py"))
    return found


def upward_imports(imports: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    wrong = []
    for module, found in imports.items():
        layer = layer_of(module)
        for target, line, _ in found:
            other = layer_of(target)
            if other != layer and other not in ALLOWED[layer]:
                wrong.append(f"{module}:{line} imports {target}: layer {layer!r} may not import {other!r}")
    return wrong


def circles(imports: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    graph = {m: sorted({t for t, _, _ in found if t in imports and t != m}) for m, found in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def lazy_imports(imports: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    return [f"{module}:{line} imports {target} inside a function"
            for module, found in imports.items() if not module.startswith(LAZY_IMPORTS_ALLOWED)
            for target, line, in_function in found
            if in_function and target not in LAZY_MODULES.get(module, ())]


def test_every_module_has_a_layer_in_the_contract() -> None:
    assert sorted({layer_of(m) for m in sources()} - set(ALLOWED)) == []


def test_no_layer_imports_a_layer_above_it() -> None:
    assert upward_imports(imports_of_house()) == []


def test_no_import_circles() -> None:
    assert circles(imports_of_house()) == []


def test_no_function_level_pal_imports_outside_the_cli() -> None:
    assert lazy_imports(imports_of_house()) == []


@pytest.mark.parametrize(("module", "source", "rule"), [
    ("pal.core.clock", "from pal.engine.runtime import Runtime\n", "layer 'core' may not import 'engine'"),
    ("pal.storage.database", "import pal.plan.graph\n", "layer 'storage' may not import 'plan'"),
    ("pal.engine.steps", "from pal.workers import app\n", "layer 'engine' may not import 'workers'"),
])
def test_the_contract_catches_a_planted_upward_import(module: str, source: str, rule: str) -> None:
    imports = imports_of_house()
    imports[module] = imports[module] + list(pal_imports(ast.parse(source), module, False))
    assert any(rule in problem for problem in upward_imports(imports))


def test_the_contract_catches_a_planted_circle_and_a_lazy_import() -> None:
    imports = imports_of_house()
    planted = "def later() -> None:\n    from pal.engine.steps import execute_step\n"
    imports["pal.engine.runtime"] = imports["pal.engine.runtime"] + list(
        pal_imports(ast.parse(planted), "pal.engine.runtime", False))
    assert any("pal.engine.runtime" in c and "pal.engine.steps" in c for c in circles(imports))
    assert any(p.startswith("pal.engine.runtime:2 imports pal.engine.steps inside a function")
               for p in lazy_imports(imports))


# The control plane (api, cli, the public client) reads and manages through the engine
# (pal.engine.control.ControlPlane, `runtime.control`), never the journal's stores: it may import
# storage's infrastructure (engines, migrations, grants, the LISTEN notifier), not name a journal.
CONTROL_PLANE = ("pal.api", "pal.cli", "pal.client")


def journal_uses(tree: ast.Module) -> Iterator[int]:
    """Lines of one file that name a journal: `x.journal`, or an import of pal.storage.journal."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "journal") or (isinstance(node, ast.ImportFrom) and node.module == "pal.storage.journal"):
            yield node.lineno


def control_plane_journal_uses(trees: dict[str, ast.Module]) -> list[str]:
    return [f"{module}:{line} names the journal: go through runtime.control (pal.engine.control)"
            for module, tree in trees.items() if module.startswith(CONTROL_PLANE)
            for line in journal_uses(tree)]


def parsed_house() -> dict[str, ast.Module]:
    return {module: ast.parse(path.read_text(), str(path)) for module, path in sources().items()}


def test_the_control_plane_never_names_the_journal() -> None:
    assert control_plane_journal_uses(parsed_house()) == []


def test_the_rule_catches_a_planted_journal_call() -> None:
    trees = parsed_house()
    trees["pal.api.runs"] = ast.parse("def f(rt):\n    return rt.journal.runs.get_run('r')\n")
    assert control_plane_journal_uses(trees) == [
        "pal.api.runs:2 names the journal: go through runtime.control (pal.engine.control)"]


# `core` holds values and rules, with no I/O of its own. Three modules read the process's own
# settings at the moment they matter, by design (docs/architecture.md, "The map"): a secret's value
# at render time, the provider keys redaction hides, the crash tests' fault points (which also
# SIGKILL their own process). DNS, files and the network live in the layers above.
CORE_IO_ALLOWED = ("pal.core.secrets", "pal.core.redact", "pal.core.faults")
IO_CALLS = frozenset({"open", "getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection",
                      "getenv", "kill", "read_text", "read_bytes", "write_text", "write_bytes", "urlopen",
                      "Popen", "check_output", "system"})
IO_MODULES = frozenset({"subprocess", "signal", "urllib.request", "http.client", "requests", "httpx"})


def io_uses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each I/O call, environment read or I/O module import in one file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in IO_CALLS:
                yield node.lineno, f"calls {name}"
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            yield node.lineno, "reads the environment"
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, f"imports {a.name}") for a in node.names if a.name in IO_MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module in IO_MODULES:
            yield node.lineno, f"imports {node.module}"


def core_io(trees: dict[str, ast.Module]) -> list[str]:
    return [f"{module}:{line} {what}: core does no I/O" for module, tree in trees.items()
            if module.startswith("pal.core") and module not in CORE_IO_ALLOWED
            for line, what in io_uses(tree)]


def test_core_does_no_io_beyond_its_three_named_readers() -> None:
    assert core_io(parsed_house()) == []


def test_the_rule_catches_planted_io_in_core() -> None:
    trees = parsed_house()
    trees["pal.core.clock"] = ast.parse("import socket, os\ndef f():\n    socket.getaddrinfo('x', 80)\n"
                                        "    return os.environ['HOME']\n")
    assert core_io(trees) == ["pal.core.clock:3 calls getaddrinfo: core does no I/O",
                              "pal.core.clock:4 reads the environment: core does no I/O"]


# SQL text has one home (docs/decisions/sql-home.md): a statement that storage sends as text is a
# named query in storage/sql/queries.sql, loaded by pal.storage.sql.queries; the stores' other
# queries are SQLAlchemy Core expressions, and the migrations keep their own DDL (not in sources()).
# A bare string statement (a docstring) is prose, never sent, and is not looked at.
SQL_HOME = "pal.storage.sql"
RAW_SQL = re.compile(r"\s*(SELECT|PREPARE|EXECUTE)\s", re.IGNORECASE)


def raw_sql(tree: ast.Module) -> Iterator[int]:
    """Lines of one file whose string constants (an f-string's parts too) begin a statement."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                and RAW_SQL.match(node.value)):
            yield node.lineno


def storage_sql_text(trees: dict[str, ast.Module]) -> list[str]:
    return [f"{module}:{line} holds SQL text: name it in storage/sql/queries.sql"
            for module, tree in trees.items()
            if layer_of(module) == "storage" and module != SQL_HOME and not module.startswith(f"{SQL_HOME}.")
            for line in raw_sql(tree)]


def test_storage_sends_sql_text_only_from_its_named_queries() -> None:
    assert storage_sql_text(parsed_house()) == []


def test_the_rule_catches_planted_sql_text_and_leaves_prose_and_core_alone() -> None:
    trees = parsed_house()
    trees["pal.storage.runs"] = ast.parse(
        '"""SELECT * FROM runs is what this module answers."""\n'
        'import sqlalchemy as sa\n'
        'GRANTS = "GRANT SELECT, INSERT ON runs"\n'
        'def f(conn, name, text):\n'
        '    """Select the run: not SQL."""\n'
        '    conn.execute(sa.select(sa.column("id")))\n'
        '    conn.exec_driver_sql("select 1")\n'
        '    return f"PREPARE {name} AS {text}", "  EXECUTE pal_x (%s)"\n')
    assert storage_sql_text(trees) == [f"pal.storage.runs:{line} holds SQL text: name it in storage/sql/queries.sql"
                                       for line in (7, 8, 8)]


# The step path passes its state along as values (a claim ahead, a RunsNext, a batch's publish):
# no module of it keeps per-thread state or a module-level mutable collection that another part
# reads behind a caller's back (docs/architecture.md, "The life of one step").
STEP_PATH = ("pal.engine.steps", "pal.engine.runtime", "pal.engine.recovery", "pal.engine.async_steps",
             "pal.storage.steps", "pal.storage.primitives", "pal.workers.tasks", "pal.workers.inline", "pal.workers.publishing",
             "pal.workers.node_messages", "pal.workers.redis_transport", "pal.workers.broker_wire")
MUTABLE_MAKERS = frozenset({"set", "dict", "list", "deque", "defaultdict", "local"})


def hidden_state(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each threading.local() anywhere, and each collection a module starts empty
    to fill later (a table written out in full is a constant)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "local":
            yield node.lineno, "keeps per-thread state"
    for statement in tree.body:
        value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
        empty_literal = (isinstance(value, ast.List | ast.Set) and not value.elts) or (
            isinstance(value, ast.Dict) and not value.keys)
        made_empty = (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                      and value.func.id in MUTABLE_MAKERS and not value.args)
        if empty_literal or made_empty:
            yield statement.lineno, "keeps a module-level mutable collection"


def step_path_state(trees: dict[str, ast.Module]) -> list[str]:
    return [f"{module}:{line} {what}: pass it along as a value" for module, tree in trees.items()
            if module in STEP_PATH for line, what in hidden_state(tree)]


def test_the_step_path_keeps_no_hidden_state() -> None:
    trees = parsed_house()
    assert set(STEP_PATH) <= trees.keys()  # a module renamed away must be renamed here too
    assert step_path_state(trees) == []


def test_the_rule_catches_planted_hidden_state() -> None:
    trees = parsed_house()
    trees["pal.workers.inline"] = ast.parse("import threading\nTAKEN: set[str] = set()\n"
                                            "class A:\n    def __init__(self):\n"
                                            "        self.held = threading.local()\n")
    assert step_path_state(trees) == [
        "pal.workers.inline:5 keeps per-thread state: pass it along as a value",
        "pal.workers.inline:2 keeps a module-level mutable collection: pass it along as a value"]
