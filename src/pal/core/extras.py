"""PAL's optional parts (`pip install 'pal[extra]'`): which extra brings a missing package, so
that code reaching one says what to install instead of a bare ModuleNotFoundError."""

from __future__ import annotations

# The top-level module a part imports -> the extra that installs it (pyproject.toml).
EXTRA_OF = {
    "psycopg2": "postgres",
    "openai": "openai",
    "anthropic": "anthropic",
    "fastapi": "api", "starlette": "api", "uvicorn": "api", "sse_starlette": "api",
    "flower": "flower", "tornado": "flower",
    "opentelemetry": "otel",
    "cryptography": "receipts",
}


def missing_extra(exc: ImportError, needed_by: str) -> str | None:
    """What to tell the user when `needed_by` failed with `exc`; None when `exc` is not a missing
    optional part (a bug, to raise as it is)."""
    name = (getattr(exc, "name", None) or "").partition(".")[0]
    extra = EXTRA_OF.get(name)
    if not isinstance(exc, ModuleNotFoundError) or extra is None:
        return None
    return (f"{needed_by} needs {name!r}, an optional part of PAL that is not installed here: "
            f"pip install 'pal[{extra}]' (or 'pal[all]')")
