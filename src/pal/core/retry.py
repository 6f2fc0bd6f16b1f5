"""Per-step retry (docs/specification.md, "Per-step retry"): a pure decision, no clock, no I/O.

A node declares `data.retry = {maxAttempts, backoffMs, retryableClasses}`. `maxAttempts` counts the
first try (default 1: no retry). The caller journals `step_retrying {attempt, of, error}` when the
decision says so and schedules the next attempt `backoff_s` later without blocking a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pal.errors import StepError

RETRY_CLASSES = ("any", "timeout", "llm", "connector", "tool")
MAX_ATTEMPTS_LIMIT = 100
MAX_BACKOFF_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_ms: int = 0
    retryable_classes: tuple[str, ...] = ("any",)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    next_attempt: int | None = None
    backoff_s: float = 0.0
    reason: str = ""


def policy_problems(raw: Any) -> list[str]:
    """What is wrong with a node's `retry` value; empty when valid (checked at validation)."""
    if not isinstance(raw, Mapping):
        return [f"data field 'retry' must be an object, not {type(raw).__name__}"]
    problems = []
    for key in raw:
        if key not in ("maxAttempts", "backoffMs", "retryableClasses"):
            problems.append(f"retry: unknown key {key!r} (allowed: maxAttempts, backoffMs, retryableClasses)")
    attempts = raw.get("maxAttempts", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        problems.append(f"retry.maxAttempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, "
                        f"not {attempts!r}")
    backoff = raw.get("backoffMs", 0)
    backoff_ok = isinstance(backoff, int | float) and not isinstance(backoff, bool)
    if not backoff_ok or not 0 <= backoff <= MAX_BACKOFF_MS:
        problems.append(f"retry.backoffMs must be a number of milliseconds from 0 to {MAX_BACKOFF_MS}, "
                        f"not {backoff!r}")
    classes = raw.get("retryableClasses", ["any"])
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        problems.append("retry.retryableClasses must be a list of strings")
    else:
        unknown = [c for c in classes if c not in RETRY_CLASSES]
        if unknown:
            problems.append(f"retry.retryableClasses: unknown class(es) {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(RETRY_CLASSES)})")
    return problems


def parse_policy(raw: Any) -> RetryPolicy:
    """The policy of a validated node's `retry` value (None: no retry)."""
    if raw is None:
        return RetryPolicy()
    return RetryPolicy(
        max_attempts=int(raw.get("maxAttempts", 1)),
        backoff_ms=int(raw.get("backoffMs", 0)),
        retryable_classes=tuple(raw.get("retryableClasses", ["any"])),
    )


def error_class(exc: BaseException) -> str:
    """The retry class of an exception: PAL's own errors say theirs; timeouts are `timeout`;
    anything else a node raised is `tool`."""
    if isinstance(exc, StepError):
        return exc.error_class
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "tool"


def decide(policy: RetryPolicy, attempt: int, failure_class: str) -> RetryDecision:
    """Whether attempt `attempt` (1-based), which failed with `failure_class`, is tried again."""
    if attempt >= policy.max_attempts:
        return RetryDecision(False, reason=f"attempt {attempt} of {policy.max_attempts}: no attempts left")
    matches = failure_class in policy.retryable_classes or (
        "any" in policy.retryable_classes and failure_class in RETRY_CLASSES
    )
    if not matches:
        return RetryDecision(False, reason=f"error class {failure_class!r} is not retryable here "
                                           f"(retryableClasses: {', '.join(policy.retryable_classes)})")
    return RetryDecision(True, next_attempt=attempt + 1, backoff_s=policy.backoff_ms / 1000.0,
                         reason=f"attempt {attempt} of {policy.max_attempts} failed ({failure_class})")


# A backoff up to this long is a Celery countdown (held by a worker's timer); a longer one lives
# in Postgres only: the lease is set to lapse at the wake-up time and the sweep re-drives the step
# then (DESIGN: ETA messages are redelivered badly, and Redis's visibility timeout is an hour).
COUNTDOWN_LIMIT_S = 10.0


def backoff_lease(wake_in_s: float, lease_ttl: float) -> tuple[float, bool]:
    """(seconds the lease must last from now, whether to publish a countdown message)."""
    if wake_in_s <= COUNTDOWN_LIMIT_S:
        return wake_in_s + lease_ttl, True
    return wake_in_s, False
