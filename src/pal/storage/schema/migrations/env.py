"""Alembic environment: PAL hands in an open connection through `config.attributes`."""

from __future__ import annotations

from alembic import context

from pal.storage.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
