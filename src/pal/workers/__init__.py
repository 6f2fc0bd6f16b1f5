"""`celery -A pal.workers worker|beat|flower`: the app built from the PAL_* environment.

The app is made on first use of `pal.workers.app` (Celery's `-A` looks it up so), not when a
module of this package is imported: an app that only uses `pal.Client` or `pal.install` never
gets it. A process that does is one PAL runs, whose every log record is redacted."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from celery.signals import worker_process_init

from pal.storage.database import dispose_after_fork

if TYPE_CHECKING:
    from pal.workers.pal_app import PalCelery

_made = threading.Lock()


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_connections_after_fork(**_: Any) -> None:
    dispose_after_fork()


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module 'pal.workers' has no attribute {name!r}")
    from pal.config import load_settings
    from pal.core.redact import install_log_redaction
    from pal.workers.pal_app import create_app

    with _made:
        made: PalCelery | None = globals().get("app")
        if made is None:
            install_log_redaction(whole_process=True)
            made = globals()["app"] = create_app(load_settings())
    return made


__all__ = ["app"]
