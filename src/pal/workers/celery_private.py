"""Every private Celery and kombu name PAL uses, each checked against the installed versions.

PAL's fast paths (a step's publish, a solo worker's inline steps, its Redis transport, batched task
events, the embedded broker's atomic writes) reach into Celery's and kombu's internals. Those move
between releases, so each path names what it needs (`PATHS`), and `fast_paths()` checks every need
once per process: a name missing, or a method whose parameters changed, turns its path off with a
warning, and PAL takes the public path instead (`send_task`, Celery's own strategy and consumer,
kombu's own transport), with the same guarantees, only slower. `PAL_CELERY_FAST_PATHS` names the
paths a process may use: `all` (the default), `none` (the crash tests run so too), or a comma list
such as `publisher,inline` (docs/decisions/celery-fast-paths.md).

Code elsewhere reaches a private name only through the accessors below, or, for the transports'
overrides of kombu methods (pal.workers.redis_transport, pal.workers.fs_transport), only when the
path that installs them is on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cache
from typing import Any

from pal.errors import ConfigError

log = logging.getLogger(__name__)

SWITCH = "PAL_CELERY_FAST_PATHS"  # all | none | a comma list of the paths a process may use


@dataclass(frozen=True)
class Need:
    """A private name: `owner` ("module:Class" or "module"), the attribute, and for a method the
    names of its leading parameters after self, in order (None: an attribute, checked to exist)."""

    owner: str
    name: str
    params: tuple[str, ...] | None = None

    def problem(self) -> str | None:
        """Why the installed Celery/kombu does not offer this need as PAL uses it; None when it does."""
        module_name, _, class_name = self.owner.partition(":")
        try:
            owner: Any = importlib.import_module(module_name)
            if class_name:
                owner = getattr(owner, class_name)
        except (ImportError, AttributeError) as exc:
            return f"{self.owner} is gone ({exc})"
        found = inspect.getattr_static(owner, self.name, None)
        if found is None:
            return f"{self.owner}.{self.name} is gone"
        if self.params is None:
            return None
        function = getattr(owner, self.name)
        try:
            names = [p for p in inspect.signature(function).parameters if p != "self"]
        except (TypeError, ValueError):
            return f"{self.owner}.{self.name} is no longer a method"
        if tuple(names[:len(self.params)]) != self.params:
            return f"{self.owner}.{self.name} takes ({', '.join(names)}), not ({', '.join(self.params)}, …)"
        return None


_REDIS = "kombu.transport.redis:Channel"
PATHS: dict[str, tuple[Need, ...]] = {
    # pal.workers.node_messages, pal.workers.broker_wire: a step's message and its task-sent event
    # written as kombu and Celery would, in one Redis transaction.
    "publisher": (
        Need(_REDIS, "_get_message_priority", ("message", "reverse")),
        Need(_REDIS, "_q_for_pri", ("queue", "pri")),
        Need(_REDIS, "_get_publish_topics", ("exchange", "routing_key")),
        Need(_REDIS, "_inplace_augment_message", ("message", "exchange", "routing_key")),
        Need("celery.app.amqp:AMQP", "_event_dispatcher"),
        Need("celery.events.dispatcher:EventDispatcher", "_prepare_event", ("type", "fields")),
    ),
    # pal.workers.inline: a solo worker runs pal.execute_node on the message itself.
    "inline": (
        Need("celery._state", "_task_stack"),
        Need("kombu.transport.virtual.base:Transport", "_deliver", ("message", "queue")),
    ),
    # pal.workers.redis_transport: one redis-py client per pool, inline doorbells taken once,
    # undecodable queue items dropped.
    "redis_transport": (
        Need(_REDIS, "_brpop_read", ()),
        Need(_REDIS, "_create_client", ()),
        Need("kombu.transport.redis:Transport", "_deliver", ("message", "queue")),
    ),
    # pal.workers.consumer: task events leave in batches.
    "event_batches": (
        Need("celery.worker.consumer.consumer:Consumer", "_flush_events", ()),
    ),
    # pal.workers.fs_transport: the embedded broker writes each message whole, then renames it,
    # and drops one it cannot decode instead of stopping the worker.
    "atomic_files": (
        Need("kombu.transport.filesystem:Channel", "_put", ("queue",)),
        Need("kombu.transport.filesystem:Channel", "_get", ("queue",)),
    ),
}


@dataclass(frozen=True)
class FastPaths:
    """Which fast paths this process uses, and why each one it does not is off."""

    off: dict[str, str]  # path -> why

    def on(self, path: str) -> bool:
        return path not in self.off


def fast_paths() -> FastPaths:
    """The fast paths the installed Celery and kombu allow, checked once per process and switch."""
    return _checked(os.environ.get(SWITCH, "all").strip().lower())


@cache
def _checked(switch: str) -> FastPaths:
    allowed = _allowed(switch)
    off = {path: f"{SWITCH}={switch}" for path in PATHS if path not in allowed}
    for path in allowed:
        problems = [p for p in (need.problem() for need in PATHS[path]) if p]
        if problems:
            off[path] = "; ".join(problems)
    off = {path: off[path] for path in PATHS if path in off}  # in PATHS' order
    for path, why in off.items():
        log.warning("pal: Celery/kombu fast path %r is off (%s): PAL takes the public path, with "
                    "the same guarantees, more slowly", path, why)
    return FastPaths(off)


def _allowed(switch: str) -> set[str]:
    if switch in ("", "all", "on"):
        return set(PATHS)
    if switch in ("none", "off"):
        return set()
    named = {name.strip() for name in switch.split(",") if name.strip()}
    unknown = named - set(PATHS)
    if unknown:
        raise ConfigError(f"{SWITCH}={switch}: no fast path {', '.join(sorted(unknown))} "
                         f"(all, none, or a comma list of: {', '.join(PATHS)})")
    return named


# The accessors: the only way the rest of PAL reaches a private name.

def task_stack() -> Any:
    """Celery's stack of the tasks this thread runs (`current_task`), pushed by an inline step."""
    from celery import _state

    return _state._task_stack


def deliver_taken(channel: Any, envelope: dict[str, Any], queue: str) -> None:
    """Hand a message taken from `queue` to kombu and Celery's consumer, as a BRPOP reply would."""
    channel.connection._deliver(envelope, queue)


def event_dispatcher(app: Any) -> Any:
    """The app's own dispatcher of task-sent events (Celery keeps one per app)."""
    return app.amqp._event_dispatcher


def prepare_event(dispatcher: Any, type_: str, fields: dict[str, Any]) -> dict[str, Any]:
    """An event as `dispatcher` would send it: its fields, hostname, clock and pid."""
    event: dict[str, Any] = dispatcher._prepare_event(type_, fields)
    return event


def queue_key(channel: Any, queue: str) -> str:
    """The Redis list kombu's Redis channel pushes a priority-0 message for `queue` onto."""
    priority = channel._get_message_priority({"properties": {"priority": 0}}, reverse=False)
    key: str = channel._q_for_pri(queue, priority)
    return key


def publish_topics(channel: Any, exchange: str, routing_key: str) -> list[str]:
    """The Redis channels a fanout publish to `exchange` with `routing_key` goes to."""
    return list(channel._get_publish_topics(exchange, routing_key))


def augment_message(channel: Any, message: dict[str, Any], exchange: str, routing_key: str) -> None:
    """Add the delivery fields kombu's Redis channel stores with a message."""
    channel._inplace_augment_message(message, exchange, routing_key)


def buffered_events(dispatcher: Any) -> Iterable[list[dict[str, Any]]]:
    """The events `dispatcher` holds for its next flush, by group; none if it no longer says."""
    buffers = getattr(dispatcher, "_group_buffer", None)
    return buffers.values() if isinstance(buffers, dict) else ()


def publish_batch(producer: Any) -> AbstractContextManager[Any]:
    """kombu's publish batch where it has one (5.7): its messages leave in one round trip at its
    end; before that, each publish goes out at once."""
    batch = getattr(producer, "batch", None)
    return batch() if callable(batch) else nullcontext()


def described(paths: FastPaths) -> Iterator[str]:
    """One line per path, for a worker's banner."""
    for path in PATHS:
        yield f"{path}: on" if paths.on(path) else f"{path}: off ({paths.off[path]})"
