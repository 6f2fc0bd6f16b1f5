"""What every `pal` command shares: exit codes, the clean failure, settings, the client and JSON.

Exit codes: 0 success; 1 the run failed or was cancelled; 2 invalid input (graph, JSON, option);
3 no such run; 4 the journal database failed; 5 timed out waiting; 6 refused (e.g. resuming a run
with a step running under a live lease, approving a step that is not waiting, cancelling a finished
run).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from pal.config import Settings, load_settings
from pal.errors import (
    BrokerUnavailable,
    ConfigError,
    GraphError,
    InputError,
    NotFound,
    PalError,
    Refused,
    StorageError,
)

if TYPE_CHECKING:
    from pal.client import Client

T = TypeVar("T")
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_STORAGE, EXIT_TIMEOUT, EXIT_REFUSED = 1, 2, 3, 4, 5, 6


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def exit_code(exc: PalError) -> int:
    if isinstance(exc, GraphError | InputError | ConfigError):
        return EXIT_BAD_INPUT
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, StorageError | BrokerUnavailable):
        return EXIT_STORAGE
    if isinstance(exc, Refused):
        return EXIT_REFUSED
    return EXIT_RUN_FAILED


def checked(operation: Callable[[], T]) -> T:
    """The operation's result; a PalError ends the command with its message and exit code."""
    try:
        return operation()
    except PalError as exc:
        fail(str(exc), exit_code(exc))


def client() -> Client:
    # Loaded when a command needs it: the client brings the engine, storage and Celery along, and
    # `pal --help` or `pal db upgrade` need none of that.
    from pal.client import Client

    try:
        return Client(settings())
    except PalError as exc:
        fail(str(exc), exit_code(exc))


def read_graph(path: Path) -> Any:
    """The graph document in file `path` (JSON or YAML), or exit 2 saying why it is not one."""
    from pal.plan.documents import load_graph_text

    if not path.is_file():
        fail(f"graph file {path} does not exist", EXIT_BAD_INPUT)
    try:
        return load_graph_text(path.read_text(), max_bytes=settings().max_graph_bytes)
    except (PalError, UnicodeDecodeError) as exc:
        fail(f"graph file {path}: {exc}", EXIT_BAD_INPUT)


def read_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not JSON: {exc}", EXIT_BAD_INPUT)


def print_rows(rows: list[dict[str, Any]], as_json: bool, empty: str,
               line: Callable[[dict[str, Any]], str]) -> None:
    """A listing: the rows as JSON, or one line each, or `empty` when there is none."""
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo(empty)
    for row in rows:
        typer.echo(line(row))


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def check_tenant(tenant: str) -> str:
    """`tenant` if it is a valid tenant id; else the command ends with exit 2."""
    from pal.engine.runs import RUN_ID

    if not RUN_ID.fullmatch(tenant) or len(tenant) > 64:
        fail(f"tenant {tenant[:80]!r} is invalid: 1-64 letters, digits, _ . : - starting with a "
             "letter or digit", EXIT_BAD_INPUT)
    return tenant
