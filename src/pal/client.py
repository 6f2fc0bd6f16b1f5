"""`pal.Client`: start runs and inspect them from Python."""

from __future__ import annotations

import getpass
import os
import time
from typing import Any

from pal.config import Settings, load_settings
from pal.core.records import Event, Handoff, RunRecord
from pal.core.run_filters import RunFilter
from pal.engine.lineage import SAME_INPUT, fork_run, retry_run
from pal.engine.runs import cancel, start_run
from pal.engine.waiting import PendingApproval, decide, pending_approvals
from pal.errors import PalError, StorageError
from pal.workers.app import create_app


class RunTimeout(PalError):
    """The run did not finish in time."""


def _user() -> str:
    """Who decides or cancels when no one is named: $USER or $LOGNAME, else this process's account
    (a container's shell often sets neither), else its uid; never "unknown"."""
    named = os.environ.get("USER") or os.environ.get("LOGNAME")
    if named:
        return named
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no account (an arbitrary container uid)
        return f"uid {os.getuid()}"


class Client:
    """Talks to the journal directly and publishes through the Celery broker.

    >>> client = Client()                       # settings from PAL_* variables
    >>> run_id = client.start_run(graph, {"ticket": "..."})
    >>> client.wait(run_id).status
    'succeeded'
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.app = create_app(self.settings)
        self.runtime = self.app.runtime

    def start_run(self, graph: Any, input: Any = None, *, run_id: str | None = None,
                  tenant_id: str | None = None, limits: dict[str, Any] | None = None,
                  traceparent: str | None = None) -> str:
        """Validate and enqueue; the same `run_id` twice returns the existing run. `limits` is the
        run's own budget over the graph's (docs/anomalies.md); `traceparent`, the W3C trace
        context its first trace links to (docs/observability.md)."""
        record, _ = start_run(self.runtime, graph, input, run_id=run_id, tenant_id=tenant_id, limits=limits,
                              traceparent=traceparent)
        return record.id

    def retry_run(self, run_id: str, *, new_run_id: str | None = None) -> str:
        """A new run retrying a failed or cancelled run (its completed steps reused); its id
        (docs/retry-and-fork.md). The same `new_run_id` twice returns the same run."""
        return retry_run(self.runtime, run_id, run_id=new_run_id).run.id

    def fork_run(self, run_id: str, from_step: str, input: Any = SAME_INPUT, *,
                 new_run_id: str | None = None) -> str:
        """A new run from a finished run's `from_step` on (the steps before it reused), with the
        source's input unless `input` is given; its id (docs/retry-and-fork.md)."""
        return fork_run(self.runtime, run_id, from_step, input, run_id=new_run_id).run.id

    def derived_runs(self, run_id: str) -> list[dict[str, Any]]:
        """The runs retried or forked from `run_id`: {run_id, kind, status}, oldest first."""
        self.runtime.journal.get_run(run_id)  # RunNotFound for an unknown id
        return self.runtime.journal.derived_runs(run_id)

    def anomalies(self, run_id: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Anomalies journaled, newest first: of one run, or of every run of this client's tenant."""
        tenant = None if run_id is not None else self.settings.tenant
        return self.runtime.journal.anomalies(run_id=run_id, tenant_id=tenant, limit=limit)

    def get_run(self, run_id: str) -> RunRecord:
        return self.runtime.journal.get_run(run_id)

    def events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        self.runtime.journal.get_run(run_id)  # RunNotFound for an unknown id
        return self.runtime.journal.events(run_id, after_seq)

    def list_runs(self, *, status: str | None = None, limit: int = 50, offset: int = 0,
                  filters: RunFilter | None = None) -> list[RunRecord]:
        """Runs newest first; `filters` (pal.core.run_filters) narrow them as GET /v1/runs does."""
        chosen = (filters or RunFilter()).as_kwargs() | ({"status": status} if status else {})
        return self.runtime.journal.list_runs(limit=limit, offset=offset, **chosen)

    def wait(self, run_id: str, timeout: float = 60.0, poll: float = 0.05) -> RunRecord:
        """Poll until the run is terminal; RunTimeout after `timeout` seconds.

        A database that is briefly unreachable (a restart) is waited out, not reported.
        """
        deadline = time.monotonic() + timeout
        status = "unknown"
        while True:
            try:
                run = self.get_run(run_id)
            except StorageError:
                if time.monotonic() > deadline:
                    raise
            else:
                if run.terminal:
                    return run
                status = run.status
            if time.monotonic() > deadline:
                raise RunTimeout(f"run {run_id} still {status} after {timeout:g}s")
            time.sleep(poll)

    def decide(self, run_id: str, step_id: str, decision: str, *, comment: str | None = None,
               by: str | None = None, expected_hash: str | None = None) -> Handoff:
        """Approve (`approved`) or reject (`rejected`) a waiting approval; Refused otherwise."""
        return decide(self.runtime, run_id, step_id, decision, by=by or _user(), comment=comment,
                      expected_hash=expected_hash)

    def approve(self, run_id: str, step_id: str, **kwargs: Any) -> Handoff:
        return self.decide(run_id, step_id, "approved", **kwargs)

    def reject(self, run_id: str, step_id: str, **kwargs: Any) -> Handoff:
        return self.decide(run_id, step_id, "rejected", **kwargs)

    def pending_approvals(self, run_id: str) -> list[PendingApproval]:
        """Undecided approvals of the run and of its child runs, parents first."""
        self.runtime.journal.get_run(run_id)  # RunNotFound for an unknown id
        return pending_approvals(self.runtime, run_id)

    def cancel(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> list[str]:
        """Cancel the run and its unfinished descendants; returns the ids cancelled."""
        return cancel(self.runtime, run_id, by=by or _user(), reason=reason)

    def close(self) -> None:
        """Release the broker connection and the journal's pooled connections (the engine
        stays usable; it reconnects on demand)."""
        if self.app.node_publisher is not None:
            self.app.node_publisher.close()
        self.app.close()
        if "journal" in self.runtime.__dict__:
            self.runtime.journal.engine.dispose()
