"""One exception root for everything PAL raises on purpose."""

from __future__ import annotations


class PalError(Exception):
    """PAL could not do what was asked."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ConfigError(PalError):
    """A PAL_* setting has a value PAL cannot use."""


class GraphError(PalError):
    """The graph is invalid; nothing was written."""

    def __init__(self, problems: list[str], what: str = "graph") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid {what} ({len(problems)} problem(s)):\n{lines}")


class InputError(PalError):
    """The run input is invalid; nothing was written."""


class TemplateError(PalError):
    """A template could not be rendered."""


class NotFound(PalError):
    """Nothing of that name is the caller's to see."""


class RunNotFound(NotFound):
    """No run with that id exists."""


class ScheduleNotFound(NotFound):
    """The tenant has no schedule of that name."""


class ToolError(PalError):
    """A tool is unknown or returned something PAL cannot journal."""


class StorageError(PalError):
    """The journal database refused or failed an operation."""

    disconnected = False  # the connection was lost (a database restart): the pool now has fresh ones


def journal_error(detail: str, *, disconnected: bool = False) -> StorageError:
    """The StorageError for a database error message, with a hint when the schema is missing."""
    if "no such table" in detail or "does not exist" in detail:
        detail += " (is the schema installed? run `pal db upgrade`)"
    error = StorageError(f"journal database error: {detail}")
    error.disconnected = disconnected
    return error


class BrokerUnavailable(PalError):
    """The broker could not take a doorbell (unreachable, refused, its TLS certificate not trusted).
    What the journal holds stays: the orphan sweep rings a journaled step's doorbell again once its
    lease lapses."""

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class Refused(PalError):
    """The request is refused in the run's current state; nothing was changed."""


class RunIdReused(Refused):
    """A run id of the caller's that already names a run of another graph or input."""


class RunIdTaken(Refused):
    """The run id is not available: choose another, or omit it for a generated one."""


class QuotaExceeded(Refused):
    """The tenant has as many runs in flight as PAL_MAX_RUNS_IN_FLIGHT allows; try again later."""


class LeaseBusy(PalError):
    """A step is running under the run's live lease; it cannot be taken over now."""


class LeaseLost(PalError):
    """Control flow: this worker's lease generation is no longer current; its writes are fenced out."""


class StepError(PalError):
    """A step failed. `code` names the failure for the journal; `error_class` is its retry class
    (`timeout`, `llm`, `connector`, `tool`), matched against a node's `retryableClasses`."""

    code = "step_failed"
    error_class = "tool"


class WorkLimitExceeded(StepError):
    """The run reached a limit on the work it may create (PAL_MAX_STEPS_PER_RUN,
    PAL_MAX_CHILD_RUNS, PAL_MAX_RUN_DEPTH); never retried."""

    code = "work_limit_exceeded"
    error_class = "limit"  # outside the retry classes: no retry policy matches it


class BudgetExceeded(StepError):
    """The run reached a limit of its budget and its policy (`onBreach: fail`) ends it
    (docs/anomalies.md); never retried."""

    code = "budget_exceeded"
    error_class = "limit"  # outside the retry classes: no retry policy matches it


class StepTimeout(StepError):
    """The step ran past its time limit (its node's timeoutMs, or PAL_STEP_TIMEOUT) and was stopped."""

    code = "step_timeout"
    error_class = "timeout"


class OutputTooLarge(StepError):
    """A step's output is over PAL_MAX_OUTPUT_BYTES or PAL_MAX_JSON_DEPTH; nothing of it is journaled."""

    code = "output_too_large"


class ProviderError(StepError):
    """The model provider refused or failed the call."""

    code = "llm_error"
    error_class = "llm"


class ProviderTimeout(ProviderError):
    """The model provider did not answer in time."""

    code = "llm_timeout"
    error_class = "timeout"


class DeliveryError(StepError):
    """An external delivery (webhook, email) failed.

    `definitely_not_sent` is True when the receiver refused or could not be reached, so nothing
    was delivered; False when the outcome is unknown (a timeout after sending)."""

    code = "delivery_failed"
    error_class = "connector"
    definitely_not_sent = True


class DeliveryOutcomeUnknown(DeliveryError):
    """A delivery broke off after it may have been sent."""

    code = "delivery_outcome_unknown"
    definitely_not_sent = False


class DeliveryTimeout(DeliveryOutcomeUnknown):
    """The receiver of a delivery did not answer in time."""

    code = "delivery_timeout"
    error_class = "timeout"


class DeliveryInDoubt(StepError):
    """A delivery was claimed but never confirmed: it may or may not have reached its receiver,
    and the receiver does not honour idempotency keys, so PAL will not send it again."""

    code = "delivery_in_doubt"
    error_class = "in_doubt"  # never retryable: a retry would be a second delivery


class TurnLimitReached(StepError):
    """A plain-LLM run used all its turns and the model still asked for tools."""

    code = "turn_limit_reached"
    error_class = "llm"


class ReceiptsOff(ConfigError):
    """Receipts are off: PAL_SIGNING_KEY is not set."""


class StepFailed(PalError):
    """A step failed for good and its run failed with it: what the `pal.execute_node` task raises
    after the failure is journaled, so Celery (and Flower) record the task as FAILURE. Picklable:
    its arguments are plain strings."""

    def __init__(self, run_id: str, step_id: str, error_type: str, message: str) -> None:
        self.run_id, self.step_id, self.error_type, self.error_message = run_id, step_id, error_type, message
        super().__init__(f"run {run_id} step {step_id} failed: {error_type}: {message}")

    def __reduce__(self) -> tuple[type[StepFailed], tuple[str, str, str, str]]:
        return type(self), (self.run_id, self.step_id, self.error_type, self.error_message)
