"""The confidence gate's arithmetic at its boundaries (pal.core.confidence): votes, log-probabilities,
stated numbers, the threshold itself, and every malformed `confidence` block refused by name."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pal.config import load_settings
from pal.core.confidence import (
    EstimatorFailed,
    GateMode,
    decision,
    is_gated,
    logprob_score,
    parse_policy,
    verbalized_score,
    vote_score,
)
from pal.errors import ConfigError, GraphError
from pal.plan.graph import parse_graph


@pytest.mark.parametrize(("yes", "expected"), [(3, "divert"), (4, "execute"), (5, "execute"), (0, "divert")])
def test_votes_of_five_against_the_default_threshold(yes: int, expected: str) -> None:
    answers = ["Yes."] * yes + ["no"] * (5 - yes)
    assert vote_score(answers) == yes / 5
    assert decision(vote_score(answers), parse_policy({}).threshold) == expected


def test_a_score_equal_to_the_threshold_runs() -> None:
    assert decision(0.75, 0.75) == "execute" and decision(0.7499, 0.75) == "divert"


def test_a_unanimous_no_is_not_confident() -> None:
    assert vote_score(["no", "No", "nope", "no", "no"]) == 0.0  # the modal answer's share would say 1.0


def test_logprobs_read_yes_as_its_probability_and_no_as_the_complement() -> None:
    assert logprob_score("yes", math.log(0.8)) == pytest.approx(0.8)
    assert logprob_score("no", math.log(0.9)) == pytest.approx(0.1)
    for bad in (None, float("nan"), 0.5):
        with pytest.raises(EstimatorFailed):
            logprob_score("yes", bad)


@pytest.mark.parametrize(("text", "score"), [("0.9", 0.9), ("I'd say 85%", 0.85), ("1", 1.0), ("0", 0.0)])
def test_a_stated_probability_is_read(text: str, score: float) -> None:
    assert verbalized_score(text) == pytest.approx(score)


@pytest.mark.parametrize("text", ["very sure", "7", "250%"])
def test_an_unreadable_or_impossible_statement_is_an_estimator_failure(text: str) -> None:
    with pytest.raises(EstimatorFailed):
        verbalized_score(text)


def test_which_nodes_are_gated() -> None:
    block = {"confidence": {}}
    assert is_gated("tool", block) and is_gated("email", block) and is_gated("connector", block)
    assert is_gated("ai-step", block) and not is_gated("ai-step", {}) and not is_gated("tool", {})
    assert not is_gated("approval", block)


@pytest.mark.parametrize(("block", "fragment"), [
    ({"threshold": 1.5}, "confidence.threshold must be a number from 0 to 1"),
    ({"threshold": True}, "confidence.threshold must be a number from 0 to 1"),
    ({"samples": 0}, "confidence.samples must be a whole number from 1 to 20"),
    ({"samples": 1000}, "confidence.samples must be a whole number from 1 to 20"),
    ({"estimator": "astrology"}, "confidence.estimator must be one of self_consistency, logprob, verbalized"),
    ({"onLow": "shrug"}, "confidence.onLow must be one of approval, fail"),
    ({"onError": "panic"}, "confidence.onError must be one of divert, proceed"),
    ({"provider": ""}, "confidence.provider must be a non-empty string"),
    ({"script": "yes"}, "confidence.script must be a list of objects"),
    ({"colour": 1}, "confidence: unknown key 'colour'"),
    ("high", "confidence must be an object"),
])
def test_a_malformed_block_is_refused_by_name(block: Any, fragment: str) -> None:
    document = {"nodes": [{"id": "t", "type": "trigger"},
                          {"id": "a", "type": "tool", "data": {"tool": "echo", "confidence": block}}],
                "edges": [{"source": "t", "target": "a"}]}
    with pytest.raises(GraphError, match="invalid graph") as raised:
        parse_graph(document)
    assert fragment in str(raised.value)


def test_a_low_confidence_edge_needs_a_gated_source() -> None:
    nodes = [{"id": "t", "type": "trigger"}, {"id": "a", "type": "tool", "data": {"tool": "echo"}},
             {"id": "b", "type": "output", "data": {"value": 1}}]
    edges = [{"source": "t", "target": "a"}, {"source": "a", "target": "b", "sourceHandle": "low_confidence"}]
    with pytest.raises(GraphError, match="which has no branches"):
        parse_graph({"nodes": nodes, "edges": edges})
    nodes[1]["data"]["confidence"] = {}
    assert parse_graph({"nodes": nodes, "edges": edges}).edges[1].source_handle == "low_confidence"


def test_the_gate_mode_setting() -> None:
    assert load_settings({}).confidence_gate is GateMode.OFF
    assert load_settings({"PAL_CONFIDENCE_GATE": "Enforce"}).confidence_gate is GateMode.ENFORCE
    with pytest.raises(ConfigError, match="PAL_CONFIDENCE_GATE='sometimes' must be one of off, shadow, enforce"):
        load_settings({"PAL_CONFIDENCE_GATE": "sometimes"})
