"""Model providers by name: `openai`, `anthropic` (official SDKs) and `scripted` (offline)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pal.core.extras import missing_extra
from pal.errors import ConfigError
from pal.providers.base import ModelRequest, ModelResponse, Provider, ToolSpec
from pal.providers.scripted import ScriptedProvider

PROVIDERS = ("scripted", "openai", "anthropic")
_cache: dict[tuple[str, str | None, float], Provider] = {}


def get_provider(name: str, *, base_urls: Mapping[str, str], timeout: float,
                 env: Mapping[str, str] | None = None) -> Provider:
    """A provider client, built once per process (SDK clients keep their connection pool)."""
    env = os.environ if env is None else env
    base_url = base_urls.get(name) or None
    key = (name, base_url, timeout)
    provider = _cache.get(key)
    if provider is not None:
        return provider
    try:
        provider = _made(name, base_url, timeout, env)
    except ModuleNotFoundError as exc:  # an SDK is an optional part: pal[openai], pal[anthropic]
        missing = missing_extra(exc, f"provider {name!r}")
        if missing is None:
            raise
        raise ConfigError(missing) from exc
    _cache[key] = provider
    return provider


def _made(name: str, base_url: str | None, timeout: float, env: Mapping[str, str]) -> Provider:
    if name == "scripted":
        return ScriptedProvider()
    if name == "openai":
        from pal.providers.openai_api import OpenAIProvider

        return OpenAIProvider(api_key=env.get("OPENAI_API_KEY"), base_url=base_url, timeout=timeout)
    if name == "anthropic":
        from pal.providers.anthropic_api import AnthropicProvider

        return AnthropicProvider(api_key=env.get("ANTHROPIC_API_KEY"), base_url=base_url, timeout=timeout)
    raise ConfigError(f"unknown provider {name!r} (known: {', '.join(PROVIDERS)})")


__all__ = ["PROVIDERS", "ModelRequest", "ModelResponse", "Provider", "ToolSpec", "get_provider"]
