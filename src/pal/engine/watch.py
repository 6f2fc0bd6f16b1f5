"""Watchfulness at a step's claim, before its node runs: the run's budget (docs/anomalies.md,
"Budgets") and the anomalies its journal reveals (docs/anomalies.md, "Rules").

Everything compared here is already in hand: the claim's step log carries the run's completed
steps, retries and spent usage, and the plan carries the budget and the thresholds. Only an anomaly
to journal (once per run, kind and step) or a budget that ends the run costs a write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pal.core import faults
from pal.core.anomalies import (
    RUN_NODE,
    Anomaly,
    AnomalyKind,
    AnomalyLimits,
    RunActivity,
    node_retry_storm,
    repeated_tool_call,
    run_anomalies,
    runaway_loop,
    step_spike,
)
from pal.core.budgets import Breach, OnBreach, Spent, breach
from pal.core.failures import failure_payload
from pal.core.loop_steps import baseline_node
from pal.core.records import Claim, RunRecord, Usage
from pal.core.step_log import StepLog
from pal.engine.runtime import Runtime
from pal.engine.tracing import span_event
from pal.errors import BudgetExceeded, PalError
from pal.nodes.approval import approval_hash
from pal.nodes.base import Park
from pal.plan.interpreter import GraphProgram, Program
from pal.plan.llm import LlmProgram

log = logging.getLogger(__name__)

# The anomaly a budget breach in `warn` mode journals: the kind of what went over.
_BREACH_KINDS = {"maxCostUsd": AnomalyKind.COST_SPIKE, "maxTokens": AnomalyKind.TOKEN_SPIKE,
                 "maxSteps": AnomalyKind.EXCESSIVE_STEPS, "maxRetries": AnomalyKind.RETRY_STORM}



def spent_of(steps: StepLog) -> Spent:
    return Spent(cost_usd=steps.cost_usd, tokens=steps.tokens, steps=len(steps.outputs),
                 retries=steps.retry_count)


def watch_claim(rt: Runtime, claim: Claim, step_id: str, generation: int, program: Program) -> Breach | None:
    """Journal what the claimed step reveals and return the budget breach that stops it (`fail`)
    or parks it (`pause`), if any. `warn` journals an anomaly and the step goes on, and so does a
    step whose pause a person approved. Below every threshold (the usual case) this is a handful
    of comparisons."""
    if claim.run is None or claim.log is None:
        return None
    run, steps = claim.run, claim.log
    watch = rt.watch_plan(run)
    limits = watch.limits
    found: list[Anomaly] = []
    usual = _usual_steps(rt, run, len(steps.outputs), limits)
    if (len(steps.outputs) > limits.max_steps or steps.retry_count > limits.max_retries
            or steps.tokens > limits.max_run_tokens or steps.cost_usd or usual):
        activity = RunActivity(len(steps.outputs), steps.retry_count, steps.cost_usd, steps.tokens)
        found = run_anomalies(activity, limits, None, usual)
    retried = len(steps.retries.get(step_id, ()))
    if retried >= limits.min_node_retries and run.graph_hash:
        baseline = rt.baselines(run.tenant_id, run.graph_hash)
        usual_retries = baseline.get((baseline_node(step_id), "retries"), ())
        _append_if(found, node_retry_storm(step_id, retried, usual_retries, limits))
    if isinstance(program, GraphProgram):
        position = program.loop_position(step_id)
        _append_if(found, runaway_loop(*position, limits) if position is not None else None)
    elif isinstance(program, LlmProgram):
        _append_if(found, _repeated_call(program, claim, step_id, limits))
    over = None
    if watch.budget is not None and step_id not in steps.over_budget:
        over = breach(watch.budget, spent_of(steps))
    if over is not None and over.on_breach is OnBreach.WARN:
        found.append(Anomaly(_BREACH_KINDS[over.limit_name], over.observed, over.limit, "static", None,
                             f"budget: {over.as_payload()['message']}"))
    if found:
        _journal_anomalies(rt, run, generation, found)
        faults.point("after_anomaly_commit", step_id, run.id)
    return over if over is not None and over.on_breach is not OnBreach.WARN else None


def _usual_steps(rt: Runtime, run: RunRecord, done: int, limits: AnomalyLimits) -> Sequence[float]:
    """How many steps the tenant's recent runs of its graph finished in (docs/anomalies.md,
    "Baselines"), read only once the run is past the fewest steps the rule could fire at (a
    multiple of one)."""
    if done <= limits.steps_over_median or not run.graph_hash:
        return ()
    return rt.baselines(run.tenant_id, run.graph_hash).get((RUN_NODE, "steps"), ())


def _append_if(found: list[Anomaly], anomaly: Anomaly | None) -> None:
    if anomaly is not None:
        found.append(anomaly)


def _repeated_call(program: LlmProgram, claim: Claim, step_id: str, limits: AnomalyLimits) -> Anomaly | None:
    """runaway_loop in a plain-LLM run: the model asked for the same tool with the same arguments
    the `same_tool_calls`-th time (journaled on that call's step, so once per repeated call)."""
    if claim.completed is None:
        return None
    times = program.times_called(claim.completed, step_id)
    return repeated_tool_call(step_id, times, limits) if times == limits.same_tool_calls else None


def watch_usage(rt: Runtime, run: RunRecord, step_id: str, generation: int, usage: Usage) -> None:
    """After a model step ran and before its completion: journal a token or cost spike against the
    node's baseline (docs/anomalies.md, "Baselines"). Never fails the step."""
    tokens = usage.input_tokens + usage.output_tokens
    if not (tokens or usage.cost_usd) or not run.graph_hash:
        return
    try:
        baseline, node = rt.baselines(run.tenant_id, run.graph_hash), baseline_node(step_id)
        limits = rt.watch_plan(run).limits
        found = [step_spike(AnomalyKind.TOKEN_SPIKE, step_id, float(tokens),
                            baseline.get((node, "tokens"), ()), limits),
                 step_spike(AnomalyKind.COST_SPIKE, step_id, float(usage.cost_usd),
                            baseline.get((node, "cost_usd"), ()), limits)]
        spikes = [a for a in found if a is not None]
        if spikes:
            _journal_anomalies(rt, run, generation, spikes)
    except PalError:
        log.exception("run %s step %s: baselines not checked", run.id, step_id)


def _journal_anomalies(rt: Runtime, run: RunRecord, generation: int, found: Sequence[Anomaly]) -> None:
    """Journal anomalies once each; those new are logged and put on the step's span."""
    for anomaly in rt.journal.anomalies.record_anomalies(rt.fence(run.id, generation), found):
        log.warning("run %s: anomaly %s: %s", run.id, anomaly.kind, anomaly.message)
        span_event("pal.anomaly", {"pal.anomaly.kind": str(anomaly.kind),
                                   "pal.anomaly.message": anomaly.message[:500]})


def budget_failure(over: Breach | Mapping[str, Any], **detail: Any) -> dict[str, Any]:
    """The journal's record of a run stopped by its budget (a breach, or the payload of a pause
    a person rejected)."""
    payload = over.as_payload() if isinstance(over, Breach) else over
    return failure_payload(BudgetExceeded(payload["message"]), limit_name=payload["limit_name"],
                           limit=payload["limit"], observed=payload["observed"], **detail)


def budget_pause(over: Breach, requested_at: datetime) -> Park:
    """What a step stopped by a budget in `pause` waits with: decided like an approval, whose
    `show` is the breach (docs/anomalies.md, "Budgets")."""
    shown = over.as_payload()
    prompt = f"Let the run go on past its budget? {shown['message']}"
    return Park({"kind": "budget", "prompt": prompt, "show": shown, "requested_at": requested_at.isoformat(),
                 "approval_hash": approval_hash(prompt, shown)}, None)
