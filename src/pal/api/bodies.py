"""The JSON request bodies of the /v1 routes (pydantic models; FastAPI validates them, and the
OpenAPI schema describes them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from pal.api.limits import unstorable_problem
from pal.core.limits import MAX_DECISION_COMMENT_CHARS
from pal.errors import InputError


class Body(BaseModel):
    """A JSON body: refused (422, naming where) when any string or key holds NUL or a lone
    surrogate, before field validation, so neither reaches the journal nor an error echo."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = unstorable_problem(data, "body")
        if problem is not None:
            raise InputError(problem)  # passes through pydantic to the PalError handler: a 422
        return data


class StartRun(Body):
    graph: dict[str, Any] = Field(description="A graph document, or a plain-LLM spec ({\"kind\": \"llm\"})")
    input: Any = None
    run_id: str | None = Field(None, description="Your own id: the same id twice returns the existing run")
    limits: dict[str, Any] | None = Field(None, description="The run's own budget over the graph's "
                                          "(maxCostUsd, maxTokens, maxSteps, maxRetries, onBreach)")
    dedupe_key: str | None = Field(None, max_length=256, description="A second start with this key "
                                   "within dedupe_window returns the first run (200)")
    dedupe_window: str | float | None = Field(None, description="How long a dedupe_key holds: a duration "
                                              "(\"24h\") or seconds; a day by default, 30 days at most")
    debounce_key: str | None = Field(None, max_length=256, description="A start with this key cancels "
                                     "the run the key queued before it that has not started")
    debounce: str | float | None = Field(None, description="With debounce_key: the run starts once this "
                                         "long (\"30s\", or seconds) passes with no newer start")
    priority: int | None = Field(None, description="1 (first) to 5 (last): the order held runs get a slot "
                                 "in (docs/fairness.md); the graph's priority, or 3, when left out")


class AddSchedule(Body):
    name: str = Field(max_length=64, description="Unique in the tenant: 1-64 letters, digits and _ . : -")
    cron: str = Field(max_length=128, description="Five cron fields (\"0 9 * * 1-5\") or @hourly, "
                                                  "@daily, ...")
    graph: dict[str, Any] = Field(description="The graph each tick runs")
    input: Any = Field(None, description="Each run's input")
    timezone: str = Field("UTC", max_length=64, description="The IANA time zone the cron reads in")
    overlap: str = Field("skip", max_length=8, description="While the previous run is in flight: skip the "
                                                          "tick, queue it, or cancel that run")
    catch_up: bool = Field(False, description="After downtime, a run per missed tick (else one)")


class Decision(Body):
    comment: str | None = Field(None, max_length=MAX_DECISION_COMMENT_CHARS,
                                description="Why; journaled with the decision (approval_decided)")
    approval_hash: str | None = Field(None, description="Refuse unless the pending approval has this hash")


class Signal(Body):
    payload: Any = Field(None, description="What the signal says: any JSON value, at most 64 KiB")


class Cancel(Body):
    reason: str | None = None


class RetryRun(Body):
    run_id: str | None = Field(None, description="Your own id for the new run: the same id twice returns it")
    graph: Any = Field(None, description="A fixed graph to run instead of the source's: every node a "
                                         "completed step ran must be in it unchanged (else 422, naming it)")


class ForkRun(Body):
    from_step: str = Field(description="The graph node to run again from: it and what follows run, "
                                       "the steps before it are reused")
    input: Any = Field(None, description="The new run's input; left out, the source run's")
    run_id: str | None = Field(None, description="Your own id for the new run: the same id twice returns it")
