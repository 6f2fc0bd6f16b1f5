"""The journal in Postgres (or SQLite): the only package that imports SQLAlchemy or opens a
transaction. Stores are split by operation family; `pal.storage.journal.Journal` joins them."""
