"""The confidence gate's policy and arithmetic (docs/anomalies.md, "The confidence gate"). Pure.

A node with a `confidence` block asks a model, before its side effect runs, how sure it is that the
action is right; below the threshold the action is diverted (to an approval, or the step fails).

    "confidence": {"threshold": 0.75, "estimator": "self_consistency", "samples": 5,
                   "provider": "openai", "model": "gpt-4o-mini", "onLow": "approval",
                   "onError": "divert"}

Estimators, each a score in [0, 1]:
- `self_consistency`: `samples` independent judgements of the action; the score is the share that
  say yes (3 of 5 is 0.6). A share of the modal answer would be confident about a unanimous "no".
- `logprob`: one judgement; the score is the probability of its first token (exp of its logprob).
- `verbalized`: one judgement that states a number from 0 to 1 (or a percentage).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pal.core.redact import redact_bounded

GATED_KINDS = frozenset({"tool", "connector", "email"})  # and an ai-step that asks for it
LOW_CONFIDENCE = "low_confidence"  # the sourceHandle a rejected diversion follows when wired
DEFAULT_THRESHOLD = 0.75
DEFAULT_SAMPLES = 5
MAX_SAMPLES = 20  # each sample is a paid model call


class GateMode(StrEnum):
    OFF = "off"  # no gate at all (the default)
    SHADOW = "shadow"  # score and journal, never block
    ENFORCE = "enforce"  # below the threshold the action is diverted


class Estimator(StrEnum):
    SELF_CONSISTENCY = "self_consistency"
    LOGPROB = "logprob"
    VERBALIZED = "verbalized"


class OnLow(StrEnum):
    APPROVAL = "approval"  # the step waits for a person, shown the action and the score
    FAIL = "fail"  # the step fails `low_confidence`


class OnError(StrEnum):
    DIVERT = "divert"  # an estimator failure is a score of 0
    PROCEED = "proceed"  # an estimator failure lets the action run, journaled as a bypass


class EstimatorFailed(Exception):
    """The estimator's answer could not be read as a score."""


@dataclass(frozen=True)
class ConfidencePolicy:
    threshold: float = DEFAULT_THRESHOLD
    estimator: Estimator = Estimator.SELF_CONSISTENCY
    samples: int = DEFAULT_SAMPLES
    provider: str = "scripted"
    model: str = "scripted-1"
    on_low: OnLow = OnLow.APPROVAL
    on_error: OnError = OnError.DIVERT
    script: tuple[Mapping[str, Any], ...] = ()  # the scripted provider's answers, one per sample

    @property
    def calls(self) -> int:
        """How many model calls the estimator makes."""
        return self.samples if self.estimator is Estimator.SELF_CONSISTENCY else 1


_CHOICES: Mapping[str, tuple[str, ...]] = {
    "estimator": tuple(Estimator), "onLow": tuple(OnLow), "onError": tuple(OnError)}
_KEYS = ("threshold", "estimator", "samples", "provider", "model", "onLow", "onError", "script")


def confidence_problems(raw: Any, where: str = "confidence") -> list[str]:
    """Every problem of a node's `confidence` block; empty when it is valid."""
    if not isinstance(raw, Mapping):
        return [f"{where} must be an object, not {type(raw).__name__}"]
    problems = [f"{where}: unknown key {k!r} (allowed: {', '.join(_KEYS)})" for k in raw if k not in _KEYS]
    threshold = raw.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        problems.append(f"{where}.threshold must be a number from 0 to 1, not {threshold!r}")
    samples = raw.get("samples", DEFAULT_SAMPLES)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        problems.append(f"{where}.samples must be a whole number from 1 to {MAX_SAMPLES}, not {samples!r}")
    for key, allowed in _CHOICES.items():
        if key in raw and raw[key] not in allowed:
            problems.append(f"{where}.{key} must be one of {', '.join(allowed)}, not {raw[key]!r}")
    for key in ("provider", "model"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            problems.append(f"{where}.{key} must be a non-empty string")
    script = raw.get("script", [])
    if not isinstance(script, list) or not all(isinstance(e, Mapping) for e in script):
        problems.append(f"{where}.script must be a list of objects")
    return problems


def parse_policy(raw: Mapping[str, Any]) -> ConfidencePolicy:
    """The policy of a validated `confidence` block."""
    return ConfidencePolicy(
        threshold=float(raw.get("threshold", DEFAULT_THRESHOLD)),
        estimator=Estimator(raw.get("estimator", Estimator.SELF_CONSISTENCY)),
        samples=int(raw.get("samples", DEFAULT_SAMPLES)),
        provider=str(raw.get("provider", "scripted")), model=str(raw.get("model", "scripted-1")),
        on_low=OnLow(raw.get("onLow", OnLow.APPROVAL)), on_error=OnError(raw.get("onError", OnError.DIVERT)),
        script=tuple(raw.get("script") or ()))


def is_gated(node_type: str, data: Mapping[str, Any]) -> bool:
    """Whether a node passes the gate: a gated kind, or an ai-step, that carries a `confidence` block."""
    return "confidence" in data and (node_type in GATED_KINDS or node_type == "ai-step")


def judgement_prompt(action: Mapping[str, Any], estimator: Estimator) -> str:
    """What the estimator asks the model about the action the node is about to take."""
    ask = ("Reply with a number from 0 to 1: how likely it is that this action is correct and safe."
           if estimator is Estimator.VERBALIZED else "Reply yes or no: is this action correct and safe?")
    return f"An agent is about to take this action:\n{_describe(action)}\n{ask}"


def _describe(action: Mapping[str, Any]) -> str:
    return "\n".join(f"{key}: {value}" for key, value in action.items())


_YES = re.compile(r"^\W*(yes|y|true|approve|correct)\b", re.I)
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)\s*(%?)")


def vote_score(answers: Sequence[str]) -> float:
    """self_consistency: the share of answers that say yes."""
    if not answers:
        raise EstimatorFailed("no samples were answered")
    return sum(1 for a in answers if _YES.match(a)) / len(answers)


def logprob_score(text: str, logprob: float | None) -> float:
    """logprob: the probability of the judgement's first token when it says yes; its complement
    when it says no."""
    if logprob is None or not math.isfinite(logprob) or logprob > 0:
        raise EstimatorFailed(f"the provider returned no usable log-probability ({logprob!r})")
    return math.exp(logprob) if _YES.match(text) else 1 - math.exp(logprob)


def verbalized_score(text: str) -> float:
    """verbalized: the first number the model states, read as a probability (85% is 0.85)."""
    match = _NUMBER.search(text)
    if match is None:
        raise EstimatorFailed(f"the model stated no number: {redact_bounded(text, 80)!r}")
    value = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 <= value <= 1:
        raise EstimatorFailed(f"the model stated {match.group(0)!r}, not a probability")
    return value


def decision(score: float, threshold: float) -> str:
    """`execute` at or above the threshold (a score equal to it runs), else `divert`."""
    return "execute" if score >= threshold else "divert"
