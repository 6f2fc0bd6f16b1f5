"""Migrated databases for tests, made quickly: the suite makes over a thousand of them.

The migrations run for real once per test process: on Postgres into a scratch schema, recording
every statement they send; on SQLite into a file. Every later database gets the same result
cheaply: the recorded statements replayed in one round trip and one transaction into the test's
own schema (they name no schema: the connection's search_path picks it), or a copy of the file.

Why this is honest: the first replay in each process is compared with the migrated original,
catalog for catalog (columns, constraints, indexes, functions, triggers, the Alembic revision), so
a migration whose work the recording missed fails the run loudly rather than handing tests another
schema. The migrations themselves are tested where they are the subject
(tests/integration/test_migrations.py calls `upgrade` directly).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pal.storage.database import create_engine
from pal.storage.schema.migrate import upgrade

# The catalog of the schema a connection's search_path names, with that schema's name masked
# (index and trigger definitions spell it).
_CATALOG = """
select 'column', table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
       || ' ' || coalesce(column_default, '')
  from information_schema.columns where table_schema = current_schema()
union all
select 'constraint', conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  from pg_constraint where connamespace = current_schema()::regnamespace
union all
select 'index', indexdef from pg_indexes where schemaname = current_schema()
union all
select 'function', p.proname || '(' || pg_get_function_arguments(p.oid) || ') ' || md5(p.prosrc)
  from pg_proc p where p.pronamespace = current_schema()::regnamespace
union all
select 'trigger', pg_get_triggerdef(t.oid) from pg_trigger t join pg_class c on c.oid = t.tgrelid
 where c.relnamespace = current_schema()::regnamespace and not t.tgisinternal
union all
select 'revision', version_num from alembic_version
"""

_lock = threading.Lock()
_script: str | None = None
_original: list[str] | None = None  # the catalog of the schema the migrations made, until checked
_sqlite_template: Path | None = None


def migrate(engine: sa.Engine) -> None:
    """Bring the empty database at `engine` to the migrations' head, as `upgrade` would."""
    if engine.dialect.name == "postgresql":
        _replay(engine)
    elif engine.dialect.name == "sqlite" and engine.url.database:
        _copy_sqlite(Path(engine.url.database))
    else:
        upgrade(engine)


def _replay(engine: sa.Engine) -> None:
    global _original
    script = _recorded_script(engine)
    raw = engine.raw_connection()
    try:
        with raw.cursor() as cursor:
            cursor.execute(script)
        raw.commit()
    finally:
        raw.close()
    with _lock:
        original, _original = _original, None
    if original is not None and (replayed := _catalog(engine)) != original:
        missing = sorted(set(original) - set(replayed))[:5]
        extra = sorted(set(replayed) - set(original))[:5]
        raise AssertionError(f"the replayed migrations differ from the migrated schema: "
                             f"missing {missing}, extra {extra} (tests/support/migrated.py)")


def _recorded_script(engine: sa.Engine) -> str:
    """The statements the migrations send to an empty schema, recorded once per process."""
    global _script, _original
    with _lock:
        if _script is not None:
            return _script
        schema = f"t_{uuid.uuid4().hex[:12]}_migrations"
        admin = create_engine(_url(engine, {}))
        statements: list[str] = []

        def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                   executemany: bool) -> None:
            # What the server received: parameters bound as psycopg2 binds them.
            sent = cursor.mogrify(statement, parameters) if parameters is not None else statement
            statements.append(sent.decode() if isinstance(sent, bytes) else sent)

        try:
            with admin.begin() as conn:
                conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
            scratch = create_engine(_url(engine, {"options": f"-csearch_path={schema}"}))
            sa.event.listen(scratch, "before_cursor_execute", record)
            try:
                upgrade(scratch)
                _original = _catalog(scratch)
            finally:
                scratch.dispose()
        finally:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()
        if any(schema in statement for statement in statements):
            raise AssertionError(f"a migration named its schema; it cannot be replayed: {schema}")
        _script = ";\n".join(statements)
        return _script


def _catalog(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        schema = conn.execute(sa.text("select current_schema()")).scalar_one()
        rows = conn.execute(sa.text(_CATALOG)).all()
    return sorted(f"{kind}: {text.replace(schema, '<schema>')}" for kind, text in rows)


def _copy_sqlite(path: Path) -> None:
    global _sqlite_template
    with _lock:
        if _sqlite_template is None:
            folder = Path(tempfile.mkdtemp(prefix="pal-migrated-"))
            template = create_engine(f"sqlite:///{folder / 'template.db'}")
            upgrade(template)
            template.dispose()  # the last connection's close folds the WAL into the file
            assert [p.name for p in folder.iterdir()] == ["template.db"]  # no WAL left beside it
            _sqlite_template = folder / "template.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_sqlite_template, path)


def _url(engine: sa.Engine, query: dict[str, str]) -> str:
    """`engine`'s database URL with `query` instead of its own (its password kept)."""
    return engine.url.set(query=query).render_as_string(hide_password=False)
