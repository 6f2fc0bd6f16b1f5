"""Admission: which runs of a tenant run now and which wait their turn, held durably (no worker,
no message) until a slot frees. A run is held when its tenant has as many admitted runs as
PAL_TENANT_CONCURRENCY (times the tenant's weight) allows, or its graph's `concurrency` key has
`limit` admitted runs; slots go to held runs by `priority` (1 first, 5 last), then age."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PRIORITY = 3
PRIORITIES = range(1, 6)
MAX_KEY_CHARS = 240  # rendered; stored with its limit in 256
MAX_KEY_LIMIT = 100_000


def pool_key(key: str, limit: int) -> str:
    """The stored key of a run's concurrency pool: its limit and its rendered key, so graphs that
    share a key with different limits are different pools, and a pass knows each pool's limit."""
    return f"{limit}:{key}"


def pool_limit(stored: str) -> int:
    return int(stored.split(":", 1)[0])


@dataclass(frozen=True)
class Admission:
    """What a new run's admission looks at (no field set: the run is admitted without a look)."""

    priority: int = DEFAULT_PRIORITY
    tenant_limit: int | None = None
    key: str | None = None  # the run's pool (pool_key): its limit and rendered key, per tenant
    key_limit: int | None = None

    @property
    def limited(self) -> bool:
        return self.tenant_limit is not None or self.key is not None


def priority_problem(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value in PRIORITIES):
        return None
    return f"{where} must be a whole number from 1 (first) to 5 (last)"


def concurrency_problems(block: Any) -> list[str]:
    """Problems of a graph's `concurrency: {key, limit}` block (the key a template over the input)."""
    if block is None:
        return []
    if not isinstance(block, Mapping) or set(block) - {"key", "limit"}:
        return ["concurrency must be an object {key, limit}"]
    problems = []
    key, limit = block.get("key"), block.get("limit")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
        problems.append(f"concurrency.key must be a string of 1 to {MAX_KEY_CHARS} characters (templated)")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_KEY_LIMIT:
        problems.append(f"concurrency.limit must be a whole number from 1 to {MAX_KEY_LIMIT}")
    return problems
