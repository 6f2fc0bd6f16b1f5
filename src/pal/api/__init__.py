"""The control plane: REST and SSE under /v1 (FastAPI on uvicorn), `pal api`.

`create_api` loads on first use, so that `pal flower` (pal.api.flower) needs Flower, not FastAPI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pal.api.app import create_api

__all__ = ["create_api"]


def __getattr__(name: str) -> Any:
    if name == "create_api":
        from pal.api.app import create_api

        return create_api
    raise AttributeError(f"module 'pal.api' has no attribute {name!r}")
