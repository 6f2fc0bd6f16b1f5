"""The confidence gate (docs/anomalies.md, "The confidence gate"): before a gated node's side effect,
a model judges the action; below the threshold the action is diverted to a person or fails.

The evaluation is journaled (`confidence_evaluated`, once per step: a unique index) before the side
effect, with what its model calls spent, and it is one of the step-log kinds a claim reads: a
re-drive after a crash reads the score back and never samples again (sampling costs tokens and is
not deterministic). Each sample's call carries an idempotency key of its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pal.core import faults
from pal.core.confidence import (
    ConfidencePolicy,
    Estimator,
    EstimatorFailed,
    GateMode,
    OnError,
    OnLow,
    decision,
    is_gated,
    judgement_prompt,
    logprob_score,
    parse_policy,
    verbalized_score,
    vote_score,
)
from pal.core.records import RunRecord, Usage
from pal.core.redact import redact_bounded
from pal.core.secrets import scrub_known
from pal.core.step_log import StepLog
from pal.engine.runtime import Runtime
from pal.engine.tracing import span_event
from pal.errors import PalError, StepError
from pal.nodes import StepContext, idempotency_key
from pal.nodes.approval import approval_hash
from pal.nodes.base import Park
from pal.plan.model import Node
from pal.providers import ModelRequest, ModelResponse

log = logging.getLogger(__name__)

_NOT_THE_ACTION = ("confidence", "retry", "timeoutMs", "label", "script")
_MAX_ACTION_CHARS = 4_000  # what the judge is shown of the action, and what the approval shows


class LowConfidence(StepError):
    """The gate diverted the action and the node says `onLow: fail`."""

    code = "low_confidence"
    error_class = "confidence"  # never retried: a retry would only sample again


class ConfidenceRejected(StepError):
    """A person rejected an action the gate had diverted, and the graph has no low_confidence edge."""

    code = "confidence_rejected"
    error_class = "confidence"


def gate(rt: Runtime, run: RunRecord, node: Node, ctx: StepContext, generation: int,
         steps: StepLog | None) -> Park | None:
    """None when the node's effect may run; a Park (an approval showing the action and its score)
    when the gate diverts it to a person. Raises LowConfidence when it diverts with `onLow: fail`."""
    mode = rt.settings.confidence_gate
    if mode is GateMode.OFF or not is_gated(node.type, node.data):
        return None
    if steps is not None and "confidence" in steps.resumed.get(ctx.step_id, ()):
        return None  # a person approved the diverted action: it runs
    policy = parse_policy(node.data["confidence"])
    action = _action(node, ctx)
    evaluated = steps.gates.get(ctx.step_id) if steps is not None else None
    if evaluated is None:
        evaluated = _evaluate(rt, run, ctx, generation, policy, action, mode)
    span_event("pal.confidence", {"pal.confidence.score": float(evaluated["score"]),
                                  "pal.confidence.threshold": float(policy.threshold),
                                  "pal.confidence.decision": str(evaluated["decision"]),
                                  "pal.confidence.bypassed": str(evaluated.get("bypassed") or "")})
    if evaluated["decision"] == "execute" or evaluated.get("bypassed"):
        return None
    if policy.on_low is OnLow.FAIL:
        raise LowConfidence(f"confidence {evaluated['score']} is below the threshold {policy.threshold}")
    shown = {"action": action, "score": evaluated["score"], "threshold": policy.threshold,
             "estimator": str(policy.estimator)}
    prompt = (f"Low confidence ({evaluated['score']} < {policy.threshold}) in {node.type} "
              f"step {ctx.step_id!r}: run it anyway?")
    return Park({"kind": "confidence", "prompt": prompt, "show": shown,
                 "requested_at": ctx.now().isoformat(), "approval_hash": approval_hash(prompt, shown)})


def _action(node: Node, ctx: StepContext) -> dict[str, Any]:
    """What the node is about to do, rendered as its effect would see it, its secret values
    replaced by their placeholders (the approval shows it), then bounded."""
    rendered = scrub_known(ctx.render({k: v for k, v in node.data.items() if k not in _NOT_THE_ACTION}))
    text = json.dumps(rendered, sort_keys=True, default=str)
    if len(text) > _MAX_ACTION_CHARS:
        return {"type": node.type, "data": text[:_MAX_ACTION_CHARS] + " …"}
    return {"type": node.type, "data": rendered}


def _evaluate(rt: Runtime, run: RunRecord, ctx: StepContext, generation: int, policy: ConfidencePolicy,
              action: Mapping[str, Any], mode: GateMode) -> Mapping[str, Any]:
    """Sample the estimator, journal `confidence_evaluated` (and `confidence_gate_bypassed` when
    policy lets the action through regardless), and return what was journaled."""
    usage, failure = Usage(), None
    try:
        score, usage = _score(ctx, policy, action)
    except (EstimatorFailed, PalError) as exc:
        score, failure = 0.0, f"{type(exc).__name__}: {exc}"  # in enforce mode a failure diverts
    chosen = decision(score, policy.threshold)
    bypassed = None
    if chosen == "divert" and mode is GateMode.SHADOW:
        bypassed = "shadow"
    elif failure is not None and policy.on_error is OnError.PROCEED:
        bypassed = "estimator_failed"
    evaluated: dict[str, Any] = {
        "score": round(score, 6), "threshold": policy.threshold, "decision": chosen,
        "estimator": str(policy.estimator), "samples": policy.calls, "mode": str(mode),
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "cost_usd": str(usage.cost_usd)}}
    if failure is not None:
        evaluated["error"] = redact_bounded(failure, 500)  # journaled: redacted, then cut
    if bypassed is not None:
        evaluated["bypassed"] = bypassed
    kept = rt.journal.confidence.record_confidence(rt.fence(run.id, generation), ctx.step_id, ctx.attempt,
                                                   evaluated, usage)
    faults.point("after_confidence_commit", ctx.step_id, run.id)
    log.info("run %s step %s: confidence %s (threshold %s): %s%s", run.id, ctx.step_id, evaluated["score"],
             policy.threshold, chosen, f", bypassed ({bypassed})" if bypassed else "")
    return kept


def _score(ctx: StepContext, policy: ConfidencePolicy, action: Mapping[str, Any]) -> tuple[float, Usage]:
    services = ctx.need_services()
    provider = services.provider(policy.provider)
    prompt = judgement_prompt(action, policy.estimator)
    answers: list[ModelResponse] = []
    for sample in range(policy.calls):
        script = (dict(policy.script[sample]),) if sample < len(policy.script) else ()
        request = ModelRequest(model=policy.model, messages=({"role": "user", "content": prompt},),
                               max_tokens=16, temperature=1.0 if policy.calls > 1 else 0.0, script=script,
                               logprobs=policy.estimator is Estimator.LOGPROB)
        key = idempotency_key(ctx.run_id, f"{ctx.step_id}#confidence.{sample}", ctx.attempt)
        answers.append(provider.complete(request, key))
    tokens_in = sum(a.input_tokens for a in answers)
    tokens_out = sum(a.output_tokens for a in answers)
    cost = sum((services.price(policy.model, a.input_tokens, a.output_tokens, a.model) or Decimal(0)
                for a in answers), Decimal(0))
    usage = Usage(tokens_in, tokens_out, cost)
    if policy.estimator is Estimator.SELF_CONSISTENCY:
        return vote_score([a.text for a in answers]), usage
    if policy.estimator is Estimator.LOGPROB:
        return logprob_score(answers[0].text, answers[0].logprob), usage
    return verbalized_score(answers[0].text), usage
