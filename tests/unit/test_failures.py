"""pal.core.failures: a failure's journal record carries its traceback, redacted and bounded (its end
kept), and StepFailed (what `pal.execute_node` raises after a failure) survives pickling."""

from __future__ import annotations

import pickle

from pal.core.failures import MAX_TRACEBACK_CHARS, bounded_traceback, failure_payload
from pal.errors import StepFailed, StepTimeout


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _chain(n: int) -> ValueError:
    """An exception with `n` causes before it, each with its own frame and message."""
    exc = _raised(LookupError("the first cause"))
    for i in range(n):
        wrapper = ValueError(f"wrapped {i}") if i == n - 1 else LookupError(f"wrapped {i}")
        wrapper.__cause__ = exc
        exc = _raised(wrapper)
    assert isinstance(exc, ValueError)
    return exc


def test_the_payload_keeps_its_fields_and_adds_the_traceback() -> None:
    payload = failure_payload(_raised(RuntimeError("kaput")), child_run_id="r1")
    assert {k: v for k, v in payload.items() if k != "traceback"} == {
        "type": "RuntimeError", "message": "kaput", "code": "step_failed", "class": "tool", "child_run_id": "r1"}
    assert payload["traceback"].startswith("Traceback (most recent call last):")
    assert "in _raised" in payload["traceback"] and payload["traceback"].rstrip().endswith("RuntimeError: kaput")


def test_a_failure_never_raised_has_an_empty_traceback() -> None:
    assert failure_payload(StepTimeout("made up"))["traceback"] == ""


def test_credentials_in_a_traceback_are_redacted() -> None:
    url = "https://admin:hunter2hunter2@db.internal/x?token=abcdef123456"
    text = bounded_traceback(_raised(ConnectionError(f"cannot reach {url} with api_key=sk-live0123456789abc")))
    assert "hunter2hunter2" not in text and "abcdef123456" not in text and "sk-live0123456789abc" not in text
    assert "[redacted]" in text


def test_a_long_traceback_keeps_its_end_within_the_bound() -> None:
    deep = _chain(200)  # 200 causes, each printed: far more than the bound holds
    full = bounded_traceback(deep, limit=10**9)
    text = bounded_traceback(deep)
    assert len(full) > MAX_TRACEBACK_CHARS >= len(text)
    assert text.startswith("… (") and "characters of the traceback left out" in text.splitlines()[0]
    assert text.rstrip().endswith("ValueError: wrapped 199")
    assert text.splitlines()[1] in full.splitlines()  # cut at a line's start: the first line kept is whole
    assert full.endswith(text.split("\n", 1)[1])


def test_a_wrapped_failure_shows_its_cause() -> None:
    outer = StepTimeout("stopped")
    outer.__cause__ = _raised(KeyError("inner"))
    text = bounded_traceback(outer)
    assert "KeyError: 'inner'" in text and "direct cause" in text and text.rstrip().endswith("stopped")


def test_step_failed_names_run_step_and_error_and_pickles() -> None:
    exc = StepFailed("run_1", "bad", "RuntimeError", "kaput")
    assert str(exc) == "run run_1 step bad failed: RuntimeError: kaput"
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back, StepFailed) and str(back) == str(exc) and back.step_id == "bad"
