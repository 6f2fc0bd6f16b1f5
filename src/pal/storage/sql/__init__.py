"""The current text of PAL's server-side functions (functions.sql), which migrations load.

A migration that loads the file records the sha256 it was written for; the newest loader's must be
the file's own (tests/integration/test_migrations.py), so a changed function always comes with a
migration that brings existing databases to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

FUNCTIONS_SQL = Path(__file__).with_name("functions.sql")
_END = "\n-- end\n"


def functions_text() -> str:
    return FUNCTIONS_SQL.read_text()


def functions_sha256() -> str:
    return hashlib.sha256(functions_text().encode()).hexdigest()


def function_statements() -> list[str]:
    """One `CREATE OR REPLACE FUNCTION` statement per function, in the file's order."""
    parts = functions_text().split(_END)
    return [part.strip() for part in parts if "CREATE OR REPLACE FUNCTION" in part]


def load_functions(execute: Callable[[str], object], dialect: str) -> None:
    """What a loader migration runs: every function of the file, created or replaced (Postgres
    only; SQLite has no server-side functions and takes the transactional path)."""
    if dialect != "postgresql":
        return
    for statement in function_statements():
        execute(statement)
