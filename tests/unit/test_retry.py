"""The retry decision is a pure function of (policy, attempt, error class)."""

from __future__ import annotations

import pytest

from pal.core import retry
from pal.core.retry import RetryPolicy, decide, error_class, parse_policy, policy_problems
from pal.errors import DeliveryError, DeliveryInDoubt, DeliveryTimeout, ProviderError, ProviderTimeout


def test_default_policy_means_one_attempt_and_no_retry() -> None:
    assert parse_policy(None) == RetryPolicy(max_attempts=1)
    assert not decide(parse_policy(None), 1, "tool").retry


def test_max_attempts_counts_the_first_try() -> None:
    policy = parse_policy({"maxAttempts": 3, "backoffMs": 250})
    first, second, third = (decide(policy, n, "tool") for n in (1, 2, 3))
    assert (first.retry, first.next_attempt, first.backoff_s) == (True, 2, 0.25)
    assert (second.retry, second.next_attempt) == (True, 3)
    assert not third.retry and "no attempts left" in third.reason


@pytest.mark.parametrize(("classes", "failure", "retried"), [
    (["any"], "tool", True), (["any"], "timeout", True), (["any"], "llm", True),
    (["llm", "connector"], "llm", True), (["llm", "connector"], "connector", True),
    (["llm", "connector"], "tool", False), (["timeout"], "llm", False),
    (["any"], "in_doubt", False),  # a delivery in doubt is never retried: it would deliver twice
])
def test_only_retryable_classes_are_retried(classes: list[str], failure: str, retried: bool) -> None:
    decision = decide(parse_policy({"maxAttempts": 5, "retryableClasses": classes}), 1, failure)
    assert decision.retry is retried
    if not retried:
        assert "not retryable" in decision.reason


@pytest.mark.parametrize(("exc", "cls"), [
    (RuntimeError("x"), "tool"), (TimeoutError(), "timeout"), (ProviderError(), "llm"),
    (ProviderTimeout(), "timeout"), (DeliveryError(), "connector"), (DeliveryTimeout(), "timeout"),
    (DeliveryInDoubt(), "in_doubt"),
])
def test_error_classes(exc: BaseException, cls: str) -> None:
    assert error_class(exc) == cls


@pytest.mark.parametrize(("raw", "fragment"), [
    ("3", "must be an object"),
    ({"maxAttempts": 0}, "maxAttempts must be a whole number from 1"),
    ({"maxAttempts": True}, "maxAttempts must be a whole number"),
    ({"maxAttempts": 1000}, "maxAttempts must be a whole number from 1 to 100"),
    ({"backoffMs": -1}, "backoffMs must be a number of milliseconds"),
    ({"retryableClasses": "llm"}, "must be a list of strings"),
    ({"retryableClasses": ["network"]}, "unknown class(es) 'network'"),
    ({"tries": 2}, "unknown key 'tries'"),
])
def test_bad_policies_are_described(raw: object, fragment: str) -> None:
    problems = policy_problems(raw)
    assert any(fragment in p for p in problems), problems


def test_valid_policy_has_no_problems() -> None:
    assert policy_problems({"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm", "connector"]}) == []
    assert retry.RETRY_CLASSES == ("any", "timeout", "llm", "connector", "tool")
