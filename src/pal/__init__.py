"""PAL: durable execution of AI-agent workflow graphs on Celery, journaled in Postgres."""

from __future__ import annotations

from pal.client import Client
from pal.errors import PalError
from pal.tools import tool

__version__ = "0.1.0"
__all__ = ["Client", "PalError", "__version__", "tool"]
