"""`celery -A pal.workers worker|beat|flower`: the app built from the PAL_* environment."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_process_init

from pal.config import load_settings
from pal.storage.database import dispose_after_fork
from pal.workers.app import PalCelery, create_app


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_connections_after_fork(**_: Any) -> None:
    dispose_after_fork()


app: PalCelery = create_app(load_settings())

__all__ = ["PalCelery", "app", "create_app"]
