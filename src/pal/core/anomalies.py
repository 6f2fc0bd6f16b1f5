"""Anomalies: what a step reveals about its run, decided from numbers the journal already holds
(docs/anomalies.md). Informational: an anomaly never changes control flow on its own.

Pure: the engine passes what the run has done so far (`RunActivity`) and the thresholds in force
(`AnomalyLimits`: defaults, then PAL_ANOMALY_* variables, then the graph's `anomalies` block); the
answer is the list of anomalies, each journaled at most once per (run, kind, step).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from enum import StrEnum
from typing import Any

MAD_SCALE = 1.4826  # a normal distribution's standard deviation per median absolute deviation
MIN_BASELINE_SAMPLES = 20
RUN_NODE = "*"  # the node id of a run-level baseline: (RUN_NODE, "steps") is steps per succeeded run


class AnomalyKind(StrEnum):
    RUNAWAY_LOOP = "runaway_loop"
    EXCESSIVE_STEPS = "excessive_steps"
    RETRY_STORM = "retry_storm"
    COST_SPIKE = "cost_spike"
    TOKEN_SPIKE = "token_spike"


@dataclass(frozen=True)
class Anomaly:
    kind: AnomalyKind
    observed: Decimal | int | float
    limit: Decimal | int | float
    basis: str  # "static" | "baseline"
    step_id: str | None
    message: str

    def as_payload(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "observed": _number(self.observed), "limit": _number(self.limit),
                "basis": self.basis, "step_id": self.step_id, "message": self.message}


def _number(value: Decimal | int | float) -> Any:
    return str(value) if isinstance(value, Decimal) else value


@dataclass(frozen=True)
class AnomalyLimits:
    """Every threshold, each with its default; `graph_key` names it in a graph's `anomalies` block
    and PAL_ANOMALY_<NAME> in the environment (docs/anomalies.md)."""

    loop_fraction: float = 0.8  # runaway_loop: a loop reached this share of its maxIterations
    same_tool_calls: int = 3  # runaway_loop: a plain-LLM run called one tool with the same arguments
    max_steps: int = 1000  # excessive_steps (static)
    steps_over_median: float = 3.0  # excessive_steps against finished runs of the same graph
    max_retries: int = 10  # retry_storm (static)
    retries_over_median: float = 3.0  # retry_storm: a node retrying more than this many times its usual
    min_node_retries: int = 3  # ... and at least this many times (a node that usually never retries)
    spike_mads: float = 5.0  # cost/token spike: above median + this many scaled MADs ...
    spike_ratio: float = 3.0  # ... and at least this many times the median
    max_run_cost_usd: float = 10.0  # cost_spike for the whole run (static)
    max_run_tokens: int = 1_000_000  # token_spike for the whole run (static)


GRAPH_KEYS = {"loopFraction": "loop_fraction", "sameToolCalls": "same_tool_calls", "maxSteps": "max_steps",
              "stepsOverMedian": "steps_over_median", "maxRetries": "max_retries",
              "retriesOverMedian": "retries_over_median", "minNodeRetries": "min_node_retries",
              "spikeMads": "spike_mads",
              "spikeRatio": "spike_ratio", "maxRunCostUsd": "max_run_cost_usd",
              "maxRunTokens": "max_run_tokens"}


def anomalies_problems(raw: Any, where: str = "anomalies") -> list[str]:
    """Every problem of a graph's `anomalies` block; empty when valid (None: the defaults)."""
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        return [f"{where} must be an object, not {type(raw).__name__}"]
    problems = []
    for key, value in raw.items():
        if key not in GRAPH_KEYS:
            problems.append(f"{where}: unknown key {key!r} (allowed: {', '.join(GRAPH_KEYS)})")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 10**15:
            problems.append(f"{where}.{key} must be a positive number, not {value!r}")
    return problems


def with_overrides(limits: AnomalyLimits, block: Mapping[str, Any] | None) -> AnomalyLimits:
    """`limits` with a validated graph block's values over it."""
    if not block:
        return limits
    types = {f.name: f.type for f in fields(AnomalyLimits)}
    changes: dict[str, Any] = {GRAPH_KEYS[k]: (int(v) if types[GRAPH_KEYS[k]] == "int" else float(v))
                               for k, v in block.items()}
    return replace(limits, **changes)


@dataclass(frozen=True)
class RunActivity:
    """What the run has done when a step completes (or is claimed)."""

    steps: int  # steps completed
    retries: int  # step_retrying events
    cost_usd: Decimal
    tokens: int


def run_anomalies(activity: RunActivity, limits: AnomalyLimits, step_id: str | None,
                  finished_step_counts: Sequence[float] = ()) -> list[Anomaly]:
    """The run-level anomalies `activity` reveals: too many steps, a retry storm, a run that
    spent past its static cost or token limit."""
    found = []
    if activity.steps > limits.max_steps:
        found.append(Anomaly(AnomalyKind.EXCESSIVE_STEPS, activity.steps, limits.max_steps, "static", step_id,
                             f"the run has completed {activity.steps} steps (limit {limits.max_steps})"))
    elif len(finished_step_counts) >= MIN_BASELINE_SAMPLES:
        usual = statistics.median(finished_step_counts)
        if activity.steps > limits.steps_over_median * usual:
            found.append(Anomaly(AnomalyKind.EXCESSIVE_STEPS, activity.steps,
                                 limits.steps_over_median * usual, "baseline", step_id,
                                 f"the run has completed {activity.steps} steps; runs of this graph "
                                 f"usually finish in {usual:g}"))
    if activity.retries > limits.max_retries:
        found.append(Anomaly(AnomalyKind.RETRY_STORM, activity.retries, limits.max_retries, "static", step_id,
                             f"the run has retried {activity.retries} times (limit {limits.max_retries})"))
    if activity.cost_usd and float(activity.cost_usd) > limits.max_run_cost_usd:
        max_cost = Decimal(str(limits.max_run_cost_usd))
        found.append(Anomaly(AnomalyKind.COST_SPIKE, activity.cost_usd, max_cost, "static", step_id,
                             f"the run has spent ${activity.cost_usd} (limit ${max_cost})"))
    if activity.tokens > limits.max_run_tokens:
        found.append(Anomaly(AnomalyKind.TOKEN_SPIKE, activity.tokens, limits.max_run_tokens, "static",
                             step_id,
                             f"the run has used {activity.tokens} tokens (limit {limits.max_run_tokens})"))
    return found


def node_retry_storm(step_id: str, retries: int, usual_retries: Sequence[float],
                     limits: AnomalyLimits) -> Anomaly | None:
    """retry_storm on the baseline basis: the step has retried at least `min_node_retries` times
    and more than `retries_over_median` times the median of its node's retries in recent runs of
    the same graph (at least MIN_BASELINE_SAMPLES of them)."""
    if retries < limits.min_node_retries or len(usual_retries) < MIN_BASELINE_SAMPLES:
        return None
    usual = statistics.median(usual_retries)
    limit = limits.retries_over_median * usual
    if retries <= limit:
        return None
    return Anomaly(AnomalyKind.RETRY_STORM, retries, limit, "baseline", step_id,
                   f"step {step_id!r} has retried {retries} times; its node usually retries {usual:g} times")


def runaway_loop(loop_id: str, iterations: int, max_iterations: int, limits: AnomalyLimits) -> Anomaly | None:
    """A loop that reached `loop_fraction` of its maxIterations."""
    threshold = limits.loop_fraction * max_iterations
    if max_iterations <= 0 or iterations < threshold:
        return None
    return Anomaly(AnomalyKind.RUNAWAY_LOOP, iterations, threshold, "static", loop_id,
                   f"loop {loop_id!r} has {iterations} of at most {max_iterations} iterations")


def repeated_tool_call(step_id: str, times: int, limits: AnomalyLimits) -> Anomaly | None:
    """A plain-LLM run that called one tool with the same arguments `times` times."""
    if times < limits.same_tool_calls:
        return None
    return Anomaly(AnomalyKind.RUNAWAY_LOOP, times, limits.same_tool_calls, "static", step_id,
                   f"the model called the same tool with the same arguments {times} times")


def spike_limit(samples: Sequence[float], limits: AnomalyLimits) -> float | None:
    """The value above which a step's cost or tokens is a spike against its baseline (median +
    spike_mads scaled MADs, and at least spike_ratio times the median: LLM cost is heavy-tailed, and
    a mean and standard deviation band is dragged up by the very spikes it should catch). None
    while the baseline has fewer than MIN_BASELINE_SAMPLES samples."""
    if len(samples) < MIN_BASELINE_SAMPLES:
        return None
    median = statistics.median(samples)
    mad = statistics.median(abs(s - median) for s in samples)
    return max(median + limits.spike_mads * MAD_SCALE * mad, limits.spike_ratio * median)


def step_spike(kind: AnomalyKind, step_id: str, value: float, samples: Sequence[float],
               limits: AnomalyLimits) -> Anomaly | None:
    limit = spike_limit(samples, limits)
    if limit is None or value <= limit or value <= 0:
        return None
    what = "cost $" if kind is AnomalyKind.COST_SPIKE else "tokens "
    return Anomaly(kind, value, round(limit, 6), "baseline", step_id,
                   f"step {step_id!r} {what.strip()} {value:g} is over its usual (limit {limit:g})")
