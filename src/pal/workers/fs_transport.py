"""The embedded broker: kombu's filesystem transport, with atomic writes and short drains.

kombu writes a message file in place (open, then write), while a consumer in another thread or
process lists the folder and reads every `*.{queue}.msg` it finds: a reader can catch a file that
is created but still empty, fail to decode it, and crash its worker (seen in this suite). Writing to
`….msg.part`, which no reader matches, then renaming it into place makes a message appear whole or
not at all.
"""

from __future__ import annotations

import logging
import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    def _get(self, queue: Any, timeout: Any = None) -> Any:
        # A file that does not decode (seen intermittently on kombu 5.5, whose reader moves a file
        # to the temporary folder before reading it) stopped the worker with "Unrecoverable error".
        # The file is gone by then: the message is dropped and logged, and the sweep re-drives the
        # step whose doorbell it was, as for a lost message on Redis.
        try:
            return super()._get(queue)  # type: ignore[no-untyped-call]
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            log.warning("a message on the embedded broker's queue %.200s did not decode, dropped: %r",
                        queue, exc)
            raise Empty() from exc

    # kombu names the argument `payload` here and `message` in its base class; mypy sees both.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))  # type: ignore[no-untyped-call]
            os.replace(partial, final)  # atomic on one filesystem: readers see all of it or nothing
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


# Celery's loop for a polling transport waits up to 2 s per drain before it looks whether the worker
# should stop; shorter drains make a stopping embedded worker stop at once, for a few more polls.
MAX_DRAIN_S = 0.2


class Transport(filesystem.Transport):
    Channel = Channel

    # kombu types this method two ways (base: **kwargs, virtual: timeout); we follow the virtual one.
    def drain_events(self, connection: Any, timeout: Any = None) -> Any:  # type: ignore[override]
        short = MAX_DRAIN_S if timeout is None else min(timeout, MAX_DRAIN_S)
        return super().drain_events(connection, timeout=short)  # type: ignore[no-untyped-call]


TRANSPORT = f"{__name__}:Transport"
