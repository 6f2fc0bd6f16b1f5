"""The control plane: REST and SSE under /v1 (FastAPI on uvicorn), `pal api`."""

from pal.api.app import create_api

__all__ = ["create_api"]
