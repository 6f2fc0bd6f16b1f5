"""Anomaly rules (pal.core.anomalies) at their boundaries: static limits, the loop fraction, the
repeated tool call, and the robust baseline (median + MADs, and a ratio of the median)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from pal.core.anomalies import (
    MIN_BASELINE_SAMPLES,
    AnomalyKind,
    AnomalyLimits,
    RunActivity,
    anomalies_problems,
    node_retry_storm,
    repeated_tool_call,
    run_anomalies,
    runaway_loop,
    spike_limit,
    step_spike,
    with_overrides,
)
from pal.core.loop_steps import baseline_node

LIMITS = AnomalyLimits()


def activity(**kwargs: Any) -> RunActivity:
    return RunActivity(**({"steps": 1, "retries": 0, "cost_usd": Decimal(0), "tokens": 0} | kwargs))


@pytest.mark.parametrize(("kwargs", "kinds"), [
    ({"steps": 1000}, []),
    ({"steps": 1001}, [AnomalyKind.EXCESSIVE_STEPS]),
    ({"retries": 10}, []),
    ({"retries": 11}, [AnomalyKind.RETRY_STORM]),
    ({"cost_usd": Decimal("10")}, []),
    ({"cost_usd": Decimal("10.01")}, [AnomalyKind.COST_SPIKE]),
    ({"tokens": 1_000_000}, []),
    ({"tokens": 1_000_001}, [AnomalyKind.TOKEN_SPIKE]),
])
def test_static_run_limits_are_crossed_only_past_the_limit(kwargs: dict[str, Any],
                                                           kinds: list[AnomalyKind]) -> None:
    found = run_anomalies(activity(**kwargs), LIMITS, "s")
    assert [a.kind for a in found] == kinds
    assert all(a.basis == "static" and a.step_id == "s" for a in found)


def test_excessive_steps_against_finished_runs_needs_enough_of_them() -> None:
    usual = [10] * (MIN_BASELINE_SAMPLES - 1)
    assert run_anomalies(activity(steps=31), LIMITS, "s", usual) == []
    usual.append(10)
    assert run_anomalies(activity(steps=30), LIMITS, "s", usual) == []
    [found] = run_anomalies(activity(steps=31), LIMITS, "s", usual)
    assert (found.kind, found.basis, found.limit) == (AnomalyKind.EXCESSIVE_STEPS, "baseline", 30.0)


@pytest.mark.parametrize(("iterations", "maximum", "trips"), [
    (7, 10, False), (8, 10, True), (10, 10, True), (799, 1000, False), (800, 1000, True), (0, 0, False)])
def test_a_loop_trips_at_its_fraction_of_max_iterations(iterations: int, maximum: int, trips: bool) -> None:
    assert (runaway_loop("L", iterations, maximum, LIMITS) is not None) is trips


def test_the_same_tool_call_trips_on_its_third_time() -> None:
    assert repeated_tool_call("turn-3.tool-0", 2, LIMITS) is None
    found = repeated_tool_call("turn-3.tool-0", 3, LIMITS)
    assert found is not None and found.kind is AnomalyKind.RUNAWAY_LOOP


def test_the_baseline_is_median_plus_mads_and_a_ratio() -> None:
    samples = [100.0] * 10 + [110.0] * 10  # median 105, MAD 5
    assert spike_limit(samples[:-1], LIMITS) is None  # 19 samples: no baseline yet
    assert spike_limit(samples, LIMITS) == pytest.approx(max(105 + 5 * 1.4826 * 5, 3 * 105))
    assert step_spike(AnomalyKind.TOKEN_SPIKE, "a", 315.0, samples, LIMITS) is None  # at the limit
    found = step_spike(AnomalyKind.TOKEN_SPIKE, "a", 316.0, samples, LIMITS)
    assert found is not None and found.basis == "baseline"
    wide = [float(x) for x in range(1, 41)]  # median 20.5, MAD 10: the MAD band wins over 3x
    assert spike_limit(wide, LIMITS) == pytest.approx(20.5 + 5 * 1.4826 * 10)


def test_a_spike_is_not_dragged_up_by_earlier_spikes() -> None:
    samples = [100.0] * 18 + [5000.0, 5000.0]  # two spikes already in the baseline
    assert step_spike(AnomalyKind.COST_SPIKE, "a", 400.0, samples, LIMITS) is not None


def test_a_graph_block_overrides_the_defaults_and_is_validated() -> None:
    tuned = with_overrides(LIMITS, {"maxRetries": 3, "loopFraction": 0.5})
    assert (tuned.max_retries, tuned.loop_fraction, tuned.max_steps) == (3, 0.5, 1000)
    assert anomalies_problems({"maxRetries": 0}) == ["anomalies.maxRetries must be a positive number, not 0"]
    assert "unknown key 'retries'" in anomalies_problems({"retries": 3})[0]
    assert anomalies_problems("x") == ["anomalies must be an object, not str"]


def test_a_node_retry_storm_needs_a_baseline_a_floor_and_three_times_the_usual() -> None:
    never = [0.0] * 20
    assert node_retry_storm("w", 2, never, LIMITS) is None  # under the floor of 3
    found = node_retry_storm("w", 3, never, LIMITS)
    assert found is not None and (found.kind, found.basis, found.step_id) == ("retry_storm", "baseline", "w")
    assert node_retry_storm("w", 3, never[:19], LIMITS) is None  # 19 samples: no baseline yet
    usually_two = [2.0] * 20
    assert node_retry_storm("w", 6, usually_two, LIMITS) is None  # 3x the median is not past it
    assert node_retry_storm("w", 7, usually_two, LIMITS) is not None


@pytest.mark.parametrize(("step_id", "node"), [
    ("ask", "ask"), ("each[3].ask", "each[*].ask"), ("each[items]", "each[items]"),
    ("outer[2].inner[10].work", "outer[*].inner[*].work"), ("each", "each")])
def test_a_loops_iterations_share_one_baseline_node(step_id: str, node: str) -> None:
    assert baseline_node(step_id) == node
