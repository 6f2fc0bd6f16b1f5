"""PAL's named queries (queries.sql): each statement its storage sends to Postgres as text, by name.

The file is a list of `-- name:` blocks, read once per process. A Query holds every form of its
statement that PAL sends: the text with numbered parameters, psycopg2's `%s` form, and its PREPARE
and EXECUTE by a stable name (pal.storage.one_call prepares the step protocol's calls once per
connection). The parameters are checked to be $1..$n, each once and in order, so that the `%s`
form passes the same values in the same places.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

QUERIES_SQL = Path(__file__).with_name("queries.sql")
_NAME_LINE = re.compile(r"--\s*name:(.*)")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")  # it names a prepared statement too: pal_<name>
_PARAM = re.compile(r"\$(\d+)")


@dataclass(frozen=True)
class Query:
    """One named statement; ValueError when its parameters are not $1..$n, each once, in order."""

    name: str
    text: str  # numbered parameters ($1, ...), each with a cast: what a PREPARE takes
    params: int = field(init=False)
    driver_sql: str = field(init=False)  # psycopg2's (%s), casts kept: execute(it, values or ())
    prepare: str = field(init=False)  # PREPARE pal_<name> AS <text>: the casts give the types
    execute: str = field(init=False)  # EXECUTE pal_<name> (%s, ...): psycopg2 fills in the values

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"query name {self.name!r} is not a lowercase identifier ([a-z_][a-z0-9_]*)")
        if not self.text.strip():
            raise ValueError(f"query {self.name!r} has no statement")
        numbers = [int(number) for number in _PARAM.findall(self.text)]
        for expected, found in enumerate(numbers, start=1):
            if found != expected:
                raise ValueError(f"query {self.name!r}: ${found} stands where ${expected} belongs "
                                 "(parameters are $1..$n, each used once, in order)")
        statement = f"pal_{self.name}"
        places = f" ({', '.join(['%s'] * len(numbers))})" if numbers else ""
        # psycopg2 reads every % of a statement it is given values for (even none: SQLAlchemy's
        # exec_driver_sql always gives some), so a literal % is doubled and values always go along.
        driver_sql = _PARAM.sub("%s", self.text.replace("%", "%%"))
        values = {"params": len(numbers), "driver_sql": driver_sql,
                  "prepare": f"PREPARE {statement} AS {self.text}", "execute": f"EXECUTE {statement}{places}"}
        for attribute, value in values.items():
            object.__setattr__(self, attribute, value)  # frozen: set once, here


def parse_queries(text: str) -> Mapping[str, Query]:
    """The queries of a queries.sql text, by name, in the file's order.

    A block is `-- name: <name>`, comment lines, then one statement: lines up to a blank line or
    the next block, joined by a space. ValueError, naming the line, for SQL outside a named
    block, a name given twice, a comment after SQL on a line, or parameters out of order."""
    found: dict[str, Query] = {}
    lines_of: dict[str, int] = {}
    name: str | None = None
    statement: list[str] = []
    ended = False  # a blank line after the statement: only comments or a new block may follow

    def close() -> None:
        if name is None:
            return
        try:
            found[name] = Query(name, " ".join(statement))
        except ValueError as exc:
            raise ValueError(f"line {lines_of[name]}: {exc}") from None

    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = _NAME_LINE.fullmatch(stripped)
        if header is not None:
            close()
            name, statement, ended = header[1].strip(), [], False
            if name in lines_of:
                raise ValueError(f"line {number}: query {name!r} is named twice "
                                 f"(first on line {lines_of[name]})")
            lines_of[name] = number
        elif not stripped:
            ended = bool(statement)
        elif stripped.startswith("--"):
            continue  # what the query is
        elif name is None or ended:
            raise ValueError(f"line {number}: SQL outside a named block (each statement follows its own "
                             f"'-- name:' line): {stripped[:60]!r}")
        elif "--" in stripped:
            raise ValueError(f"line {number}: a comment after SQL (the lines are joined into one): "
                             f"{stripped[:60]!r}")
        else:
            statement.append(stripped)
    close()
    return MappingProxyType(found)


@functools.cache
def queries() -> Mapping[str, Query]:
    """Every query of queries.sql, read and checked once per process."""
    return parse_queries(QUERIES_SQL.read_text())


def query(name: str) -> Query:
    """The query of queries.sql with this name; KeyError naming it when there is none."""
    try:
        return queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in {QUERIES_SQL.name}") from None
