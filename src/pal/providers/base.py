"""What every model provider speaks: a provider-neutral request and response.

Messages are plain JSON so they can be journaled and rebuilt on replay:
  {"role": "user", "content": "..."}
  {"role": "assistant", "content": "...", "tool_calls": [{"id", "name", "arguments"}]}
  {"role": "tool", "tool_call_id": "...", "name": "...", "content": "<JSON text>"}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


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

    @abstractmethod
    def complete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        """Call the model once; raise ProviderError / ProviderTimeout on failure."""


def last_user_text(messages: tuple[dict[str, Any], ...]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return ""
