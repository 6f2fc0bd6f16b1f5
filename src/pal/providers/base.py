"""What every model provider speaks: a provider-neutral request and response.

Messages are plain JSON so they can be journaled and rebuilt on replay:
  {"role": "user", "content": "..."}
  {"role": "assistant", "content": "...", "tool_calls": [{"id", "name", "arguments"}]}
  {"role": "tool", "tool_call_id": "...", "name": "...", "content": "<JSON text>"}
"""

from __future__ import annotations

import asyncio
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pal.errors import ProviderError, ProviderTimeout

C = TypeVar("C")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema object

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: tuple[dict[str, Any], ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    script: tuple[dict[str, Any], ...] = ()  # only the scripted provider reads it
    logprobs: bool = False  # ask for the log-probability of the answer's first token


@dataclass(frozen=True)
class ModelResponse:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
    tool_calls: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    stop_reason: str | None = None
    logprob: float | None = None  # of the first token, when asked for and the provider gives it


class Provider(ABC):
    """One model API. `complete` sends `idempotency_key` with the call so that a retried or
    replayed call of the same step attempt is de-duplicated by the provider."""

    name: str
    speaks_async: ClassVar[bool] = False  # has `acomplete`, awaited on a worker's event loop

    @abstractmethod
    def complete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        """Call the model once; raise ProviderError / ProviderTimeout on failure."""

    async def acomplete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        """`complete`, awaited (a provider that `speaks_async`)."""
        raise NotImplementedError(f"provider {self.name!r} has no async client")


@contextmanager
def sdk_errors(name: str, api_error: type[Exception], timeout_error: type[Exception]) -> Iterator[None]:
    """An SDK's failures as PAL's: its timeout as ProviderTimeout, any other API error as
    ProviderError (the SDK's timeout is one of its API errors, so it is looked at first)."""
    try:
        yield
    except timeout_error as exc:
        raise ProviderTimeout(f"{name}: no answer in time: {exc}") from exc
    except api_error as exc:
        raise ProviderError(f"{name}: {type(exc).__name__}: {exc}") from exc


class AsyncClients(Generic[C]):
    """An SDK's async client, one per event loop: its connections are bound to the loop that
    opened them, and reused by every step awaited on that loop."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, C] = weakref.WeakKeyDictionary()

    def client(self) -> C:
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            found = self._clients[loop] = self._make()
        return found


def last_user_text(messages: tuple[dict[str, Any], ...]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""
