"""What the control plane (the API, the `pal` command, `pal.Client`) reads and manages beside
starting and steering runs: runs, events, leases, lineage, anomalies, receipts, VMs, stuck runs,
the journal's invariants, API tokens. The control plane goes through this (and the engine's
services that take the runtime: signed receipts in pal.engine.run_receipts, pruning in
pal.engine.retention), never through storage (tests/architecture/test_layers.py holds it to that)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pal.core.records import Event, Lease, RunRecord, Violation
from pal.storage.journal import Journal
from pal.storage.vms import VmRecord


class ControlPlane:
    """The control plane's view of one journal (a runtime's: `Runtime.control`)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    # Runs and their journal: RunNotFound for an unknown id, or a run of another tenant.
    def get_run(self, run_id: str, tenant_id: str | None = None) -> RunRecord:
        return self._journal.runs.get_run(run_id, tenant_id)

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        return self._journal.runs.events(run_id, after_seq, limit)

    def list_runs(self, *, tenant_id: str | None = None, status: str | None = None, limit: int = 50,
                  offset: int = 0, graph: str | None = None, search: str | None = None,
                  since: datetime | None = None, until: datetime | None = None) -> list[RunRecord]:
        """Runs newest first, pages that never overlap (pal.storage.runs.RunStore.list_runs)."""
        return self._journal.runs.list_runs(tenant_id=tenant_id, status=status, limit=limit, offset=offset,
                                            graph=graph, search=search, since=since, until=until)

    def get_lease(self, run_id: str) -> Lease | None:
        return self._journal.runs.get_lease(run_id)

    def derived_runs(self, run_id: str) -> list[dict[str, Any]]:
        return self._journal.lineage.derived_runs(run_id)

    def anomalies(self, *, tenant_id: str | None = None, run_id: str | None = None,
                  since: datetime | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._journal.anomalies.anomalies(tenant_id=tenant_id, run_id=run_id, since=since, limit=limit)

    def receipts(self, run_id: str) -> list[dict[str, Any]]:
        """The side-effect receipts of a run's deliveries."""
        return self._journal.receipts.receipts(run_id)

    def vms(self, run_id: str) -> list[VmRecord]:
        return self._journal.vms.vms(run_id)

    def stuck_runs(self, *, now: datetime, limit: int = 100) -> list[tuple[RunRecord, Lease | None]]:
        return self._journal.recovery.stuck_runs(now=now, limit=limit)

    def violations(self) -> list[Violation]:
        """Every breach of the journal's invariants (`pal doctor`)."""
        return self._journal.doctor.violations()

    # API tokens: only a token's sha256 is stored.
    def create_token(self, *, tenant_id: str, name: str, now: datetime) -> tuple[str, str]:
        return self._journal.tokens.create_token(tenant_id=tenant_id, name=name, now=now)

    def revoke_token(self, *, token_id: str, now: datetime) -> bool:
        return self._journal.tokens.revoke_token(token_id=token_id, now=now)

    def list_tokens(self) -> list[dict[str, Any]]:
        return self._journal.tokens.list_tokens()

    def token_owner(self, secret: str) -> tuple[str, str] | None:
        """(tenant, token name) of a live token; None for an unknown or revoked one."""
        return self._journal.tokens.token_owner(secret)
