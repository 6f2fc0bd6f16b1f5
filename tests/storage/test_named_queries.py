"""PAL's named queries (pal/storage/sql/queries.sql): each parses with its parameters $1..$n in
order, its psycopg2 form passes them in the same places, malformed text is refused naming the
fault, and on a migrated Postgres every query PREPAREs with the parameter types of the function
it calls (a wrong function name or a wrong cast fails here)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pal.storage.sql.queries import Query, parse_queries, queries, query
from tests.storage.kit import postgres_journal

SRC = Path(__file__).resolve().parents[2] / "src"
PARAM = re.compile(r"\$(\d+)")
CALL = re.compile(r"\b(pal_\w+)\((.*)\)")  # a query that calls one of PAL's functions


def driver_places(driver_sql: str) -> int:
    """How many values psycopg2 fills into a statement (`%%` is a literal percent sign)."""
    return re.findall(r"%%|%s", driver_sql).count("%s")


def test_every_query_numbers_its_parameters_in_order_and_casts_each() -> None:
    assert queries(), "queries.sql holds no query"
    for q in queries().values():
        assert [int(n) for n in PARAM.findall(q.text)] == list(range(1, q.params + 1)), q.name
        assert len(re.findall(r"\$\d+::", q.text)) == q.params, f"{q.name}: a parameter without a cast"
        assert driver_places(q.driver_sql) == q.params, q.name
        assert q.execute.count("%s") == q.params, q.name
        assert q.prepare == f"PREPARE pal_{q.name} AS {q.text}"


def test_every_query_the_source_names_is_in_the_file_and_every_query_is_used() -> None:
    named = {node.args[0].value for path in SRC.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "query"
             and node.args and isinstance(node.args[0], ast.Constant)}
    assert named == set(queries())


def test_an_unknown_name_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match=r"no query named 'claim_stepp' in queries\.sql"):
        query("claim_stepp")


def test_a_literal_percent_sign_is_doubled_for_psycopg2_only() -> None:
    q = Query("like", "SELECT $1::text LIKE 'a%'")
    assert (q.text, q.driver_sql, q.params) == ("SELECT $1::text LIKE 'a%'", "SELECT %s::text LIKE 'a%%'", 1)
    assert q.prepare == "PREPARE pal_like AS SELECT $1::text LIKE 'a%'"
    assert q.execute == "EXECUTE pal_like (%s)"
    assert Query("one", "SELECT 1").execute == "EXECUTE pal_one"


def test_a_block_joins_its_lines_and_keeps_its_comments_out() -> None:
    parsed = parse_queries("-- header\n\n-- name: a\n-- what a is\nSELECT f($1::text,\n    $2::integer)\n"
                           "\n-- name: b\nSELECT 2\n")
    assert {name: q.text for name, q in parsed.items()} == {"a": "SELECT f($1::text, $2::integer)", "b": "SELECT 2"}


@pytest.mark.parametrize(("text", "error"), [
    ("-- name: a\nSELECT f($2::text, $1::text)\n", r"line 1: query 'a': \$2 stands where \$1 belongs"),
    ("-- name: a\nSELECT f($1::text, $1::text)\n", r"query 'a': \$1 stands where \$2 belongs"),
    ("-- name: a\nSELECT f($1::text, $3::text)\n", r"query 'a': \$3 stands where \$2 belongs"),
    ("-- header\nSELECT 1\n", r"line 2: SQL outside a named block"),
    ("-- name: a\nSELECT 1\n\nSELECT 2\n", r"line 4: SQL outside a named block"),
    ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", r"line 3: query 'a' is named twice \(first on line 1\)"),
    ("-- name: a\nSELECT 1 -- one\n", r"line 2: a comment after SQL"),
    ("-- name: a\n-- nothing else\n-- name: b\nSELECT 1\n", r"line 1: query 'a' has no statement"),
    ("-- name: Claim Step\nSELECT 1\n", r"line 1: query name 'Claim Step' is not a lowercase identifier"),
], ids=["$2 before $1", "$1 twice", "$2 missing", "SQL before a name", "a second statement",
        "a name twice", "a trailing comment", "no statement", "a bad name"])
def test_malformed_text_is_refused_naming_the_fault(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_queries(text)


@pytest.fixture
def pg_connection(pg_admin: sa.Engine) -> Iterator[Any]:
    """A DBAPI connection (psycopg2) to a freshly migrated schema of its own."""
    with postgres_journal(pg_admin) as journal:
        connection = journal.engine.raw_connection()
        try:
            yield connection
        finally:
            connection.rollback()
            connection.close()


def test_every_query_prepares_with_the_types_of_the_function_it_calls(pg_connection: Any) -> None:
    with pg_connection.cursor() as cursor:
        for q in queries().values():
            cursor.execute(q.prepare)  # sent without values, as pal.storage.one_call sends it
            cursor.execute("SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s",
                           (f"pal_{q.name}",))
            [(types,)] = cursor.fetchall()
            assert len(types) == q.params, q.name
            call = CALL.search(q.text)
            if call is None:
                continue
            cursor.execute("SELECT proargtypes::regtype[]::text[] FROM pg_proc WHERE oid = to_regproc(%s)", (call[1],))
            [(declared,)] = cursor.fetchall()
            for position, argument in enumerate(call[2].split(",")):
                param = re.match(r"\s*\$(\d+)::", argument)
                if param is not None:
                    assert types[int(param[1]) - 1] == declared[position], (
                        f"{q.name}: ${param[1]} is {types[int(param[1]) - 1]}, {call[1]}'s argument "
                        f"{position + 1} is {declared[position]}")
        cursor.execute("DEALLOCATE ALL")


def test_both_forms_send_a_literal_percent_sign_as_written(pg_connection: Any) -> None:
    q = Query("percent", "SELECT $1::text || '%'")
    with pg_connection.cursor() as cursor:
        cursor.execute(q.driver_sql, ("a",))
        assert cursor.fetchall() == [("a%",)]
        cursor.execute(q.prepare)
        cursor.execute(q.execute, ("b",))
        assert cursor.fetchall() == [("b%",)]
        cursor.execute("DEALLOCATE ALL")
