"""PAL: durable execution of AI-agent workflow graphs on Celery, journaled in Postgres.

`pal.Client`, `pal.AsyncClient`, `pal.tool`, `pal.install` and `pal.PalError` are the public face.
They load on first use, so that importing one layer (say `pal.core.templates` in a worker's tool
module) does not load them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pal.errors import PalError

if TYPE_CHECKING:
    from pal.client import AsyncClient, Client
    from pal.tools import tool
    from pal.workers.install import install

__version__ = "0.1.0"
__all__ = ["AsyncClient", "Client", "PalError", "__version__", "install", "tool"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from pal.client import Client

        return Client
    if name == "AsyncClient":
        from pal.client import AsyncClient

        return AsyncClient
    if name == "tool":
        from pal.tools import tool

        return tool
    if name == "install":
        from pal.workers.install import install

        return install
    raise AttributeError(f"module 'pal' has no attribute {name!r}")
