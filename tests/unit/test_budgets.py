"""Budgets (pal.core.budgets): each limit at its boundary, the merge of graph and run blocks, and
every malformed block refused with a message naming the key."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from pal.core.budgets import Budget, OnBreach, Spent, breach, limits_problems, parse_budget


@pytest.mark.parametrize(("limits", "spent", "expected"), [
    ({"maxTokens": 100}, Spent(tokens=99), None),
    ({"maxTokens": 100}, Spent(tokens=100), ("maxTokens", 100, 100)),
    ({"maxCostUsd": 0.5}, Spent(cost_usd=Decimal("0.4999")), None),
    ({"maxCostUsd": 0.5}, Spent(cost_usd=Decimal("0.5")), ("maxCostUsd", Decimal("0.5"), Decimal("0.5"))),
    ({"maxSteps": 3}, Spent(steps=2), None),
    ({"maxSteps": 3}, Spent(steps=3), ("maxSteps", 3, 3)),
    ({"maxRetries": 0}, Spent(retries=0), ("maxRetries", 0, 0)),
    ({"maxRetries": 2}, Spent(retries=1), None),
    ({}, Spent(tokens=10**9, steps=10**6), None),
])
def test_a_limit_is_reached_when_what_was_spent_is_at_or_over_it(
        limits: dict[str, Any], spent: Spent, expected: tuple[str, Any, Any] | None) -> None:
    found = breach(parse_budget(limits), spent)
    assert (None if found is None else (found.limit_name, found.limit, found.observed)) == expected


def test_the_first_limit_reached_is_reported_and_carries_the_policy() -> None:
    budget = parse_budget({"maxCostUsd": 1, "maxTokens": 10, "onBreach": "fail"})
    found = breach(budget, Spent(cost_usd=Decimal(2), tokens=20))
    assert found is not None and found.limit_name == "maxCostUsd" and found.on_breach is OnBreach.FAIL
    assert found.as_payload()["code"] == "budget_exceeded"


def test_a_run_block_overrides_the_graphs() -> None:
    budget = parse_budget({"maxTokens": 10, "onBreach": "fail"}, {"maxTokens": 50})
    assert budget == Budget(max_tokens=50, on_breach=OnBreach.FAIL)
    assert parse_budget(None, None).empty and parse_budget().on_breach is OnBreach.WARN


@pytest.mark.parametrize(("block", "fragment"), [
    ([], "limits must be an object, not list"),
    ({"maxTokens": "10"}, "limits.maxTokens must be a number, not str"),
    ({"maxTokens": True}, "limits.maxTokens must be a number, not bool"),
    ({"maxSteps": 2.5}, "limits.maxSteps must be a whole number"),
    ({"maxCostUsd": -1}, "limits.maxCostUsd must be between 0"),
    ({"maxCostUsd": float("nan")}, "limits.maxCostUsd must be between 0"),
    ({"maxTokens": 10**16}, "limits.maxTokens must be between 0"),
    ({"onBreach": "explode"}, "limits.onBreach must be one of warn, fail, pause"),
    ({"maxDollars": 3}, "unknown key 'maxDollars'"),
])
def test_a_malformed_block_is_refused_naming_the_key(block: Any, fragment: str) -> None:
    problems = limits_problems(block)
    assert any(fragment in p for p in problems), problems


def test_a_valid_block_has_no_problems() -> None:
    assert limits_problems({"maxCostUsd": 2.5, "maxTokens": 1000, "maxSteps": 40, "maxRetries": 3,
                            "onBreach": "pause"}) == []
    assert limits_problems(None) == []
