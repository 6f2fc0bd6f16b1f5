"""Budgets: what a run may spend before the user's policy acts (docs/anomalies.md, "Budgets").

A `limits` block on the graph (top level), overridable per run:

    {"maxCostUsd": 2.5, "maxTokens": 200000, "maxSteps": 400, "maxRetries": 20, "onBreach": "fail"}

Checked when a step is claimed, before its node runs, against what the run has already spent (a
model step's cost is not guessed), so the overshoot is at most the one step that crossed the line.
Pure: the engine passes what the journal says was spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any


class OnBreach(StrEnum):
    WARN = "warn"  # an anomaly_detected, nothing else
    FAIL = "fail"  # the run ends run_failed {code: budget_exceeded}
    PAUSE = "pause"  # the step waits like an approval: approve goes on once, reject fails the run


LIMIT_KEYS = {"maxCostUsd": "cost_usd", "maxTokens": "tokens", "maxSteps": "steps", "maxRetries": "retries"}
_MAX_LIMIT = 10**15  # far past any real budget; refuses absurd numbers instead of overflowing


@dataclass(frozen=True)
class Budget:
    max_cost_usd: Decimal | None = None
    max_tokens: int | None = None
    max_steps: int | None = None
    max_retries: int | None = None
    on_breach: OnBreach = OnBreach.WARN

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.max_cost_usd, self.max_tokens, self.max_steps, self.max_retries))


@dataclass(frozen=True)
class Spent:
    """What a run has used so far, as its journal says: completed steps' usage, steps, retries."""

    cost_usd: Decimal = Decimal(0)
    tokens: int = 0
    steps: int = 0
    retries: int = 0


@dataclass(frozen=True)
class Breach:
    limit_name: str  # "maxCostUsd" | "maxTokens" | "maxSteps" | "maxRetries"
    limit: Decimal | int
    observed: Decimal | int
    on_breach: OnBreach

    def as_payload(self) -> dict[str, Any]:
        return {"code": "budget_exceeded", "limit_name": self.limit_name, "limit": str(self.limit),
                "observed": str(self.observed), "on_breach": str(self.on_breach),
                "message": f"the run reached its {self.limit_name} of {self.limit} (spent {self.observed})"}


def limits_problems(raw: Any, where: str = "limits") -> list[str]:
    """Every problem of a `limits` block; empty when it is valid (None is valid: no limits)."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [f"{where} must be an object, not {type(raw).__name__}"]
    problems = []
    for key, value in raw.items():
        if key == "onBreach":
            if value not in tuple(OnBreach):
                problems.append(f"{where}.onBreach must be one of warn, fail, pause, not {value!r}")
        elif key in LIMIT_KEYS:
            problem = _number_problem(key, value)
            if problem:
                problems.append(f"{where}.{problem}")
        else:
            problems.append(f"{where}: unknown key {key!r} (allowed: {', '.join([*LIMIT_KEYS, 'onBreach'])})")
    return problems


def _number_problem(key: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{key} must be a number, not {type(value).__name__}"
    if key != "maxCostUsd" and not isinstance(value, int):
        return f"{key} must be a whole number, not {value!r}"
    if not math.isfinite(value) or value < 0 or value > _MAX_LIMIT:
        return f"{key} must be between 0 and {_MAX_LIMIT}, not {value!r}"
    return None


def parse_budget(*blocks: Mapping[str, Any] | None) -> Budget:
    """The budget of the validated `limits` blocks given, later ones overriding earlier ones (the
    graph's, then the run's own)."""
    merged: dict[str, Any] = {}
    for block in blocks:
        merged |= dict(block or {})
    try:
        cost = Decimal(str(merged["maxCostUsd"])) if "maxCostUsd" in merged else None
    except InvalidOperation:  # validated before; a stored block is trusted
        cost = None
    return Budget(max_cost_usd=cost, max_tokens=merged.get("maxTokens"), max_steps=merged.get("maxSteps"),
                  max_retries=merged.get("maxRetries"),
                  on_breach=OnBreach(merged.get("onBreach", OnBreach.WARN)))


def breach(budget: Budget, spent: Spent) -> Breach | None:
    """The first limit the run has reached before its next step starts, or None. A limit is reached
    when what was spent is at or over it: the next step would only add to it."""
    checks: tuple[tuple[str, Decimal | int | None, Decimal | int], ...] = (
        ("maxCostUsd", budget.max_cost_usd, spent.cost_usd),
        ("maxTokens", budget.max_tokens, spent.tokens),
        ("maxSteps", budget.max_steps, spent.steps),
        ("maxRetries", budget.max_retries, spent.retries),
    )
    for name, limit, observed in checks:
        if limit is not None and observed >= limit:
            return Breach(name, limit, observed, budget.on_breach)
    return None
