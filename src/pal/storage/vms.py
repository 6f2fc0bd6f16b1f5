"""The isolated tier's journal: VMs of microVM runs, their reports, and `resumeMicroVMRun`
(docs/isolated-tier.md).

A VM reports under the run's lease generation it was spawned with: every report is a fenced write
like a worker's, so a VM of an earlier attempt (whose lease the sweep stole) writes nothing. Each
decision about a run's VMs is taken under its lock row, so two sweepers never spawn twice (and
unique (run, attempt) says so again).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pal.core.records import Fence
from pal.core.vms import LIVE_STATES, ResumeAction, VmState, resume_action
from pal.core.vocabulary import TERMINAL_STATUSES, EventKind, RunStatus
from pal.storage.base import json_safe
from pal.storage.primitives import Primitives
from pal.storage.schema import run_locks, runs, runtime_vms

VM_LEASE_HOLDER = "vm"  # run_locks.worker_id while a VM holds the run's lease


@dataclass(frozen=True)
class VmOrder:
    """A VM to spawn: what the VM queue's task needs (never its token: the host makes that)."""

    vm_id: str
    run_id: str
    attempt: int
    generation: int
    spec: Mapping[str, Any]
    tenant_id: str = ""  # the run's: its work directory lives under PAL_VM_ROOT/<tenant>

    @property
    def resume(self) -> bool:
        return self.attempt > 1


@dataclass(frozen=True)
class VmRecord:
    id: str
    run_id: str
    tenant_id: str
    attempt: int
    generation: int
    driver: str
    state: str
    host: str | None
    pid: int | None
    exit_code: int | None
    error: str | None
    last_heartbeat: datetime | None
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "run_id": self.run_id, "attempt": self.attempt, "generation": self.generation,
                "driver": self.driver, "state": self.state, "host": self.host, "pid": self.pid,
                "exit_code": self.exit_code, "error": self.error,
                "last_heartbeat": self.last_heartbeat.isoformat() if self.last_heartbeat else None,
                "created_at": self.created_at.isoformat()}


_VM_COLUMNS = (*runtime_vms.c, runs.c.tenant_id)


class VmStore(Primitives):
    def first_vm(self, *, run_id: str, now: datetime) -> VmOrder | None:
        """The first VM of a new microVM run; None when the run has one already (a repeated start)."""
        with self._tx() as conn:
            lock = conn.execute(sa.select(run_locks).where(run_locks.c.run_id == run_id)
                                .with_for_update()).mappings().first()
            if lock is None or self._vm_count(conn, run_id):
                return None
            return self._insert_vm(conn, run_id, 1, lock["generation"], now)

    def resume_microvm_run(self, *, run_id: str, now: datetime, stale_after: float,
                           boot_lease: float) -> tuple[ResumeAction, VmOrder | None]:
        """resumeMicroVMRun for an orphaned run, in one transaction under its lock row: VMs whose
        heartbeats stopped `stale_after` seconds ago are reconciled to terminated; a run with a live
        VM is skipped; at MAX_MICROVM_RESUME_ATTEMPTS VMs the run fails `microvm_resume_exhausted`;
        otherwise the lease is stolen (generation + 1, `run_recovered`) and a VM row is added for
        the caller to spawn with PAL_RESUME=1."""
        with self._tx() as conn:
            lock = conn.execute(sa.select(run_locks).where(run_locks.c.run_id == run_id)
                                .with_for_update()).mappings().first()
            status = conn.execute(sa.select(runs.c.status).where(runs.c.id == run_id)).scalar()
            if lock is None or status in TERMINAL_STATUSES or lock["expires_at"] >= now:
                return ResumeAction.SKIP, None  # finished, or a live lease: someone holds the run
            conn.execute(runtime_vms.update().where(
                runtime_vms.c.run_id == run_id, runtime_vms.c.state.in_(LIVE_STATES),
                sa.func.coalesce(runtime_vms.c.last_heartbeat, runtime_vms.c.updated_at)
                < now - timedelta(seconds=stale_after),
            ).values(state=VmState.TERMINATED, updated_at=now,
                     error=f"lost: no heartbeat for {stale_after:g}s (reconciled by the sweep)"))
            live = conn.execute(sa.select(sa.func.count()).select_from(runtime_vms).where(
                runtime_vms.c.run_id == run_id, runtime_vms.c.state.in_(LIVE_STATES))).scalar_one()
            attempts = self._vm_count(conn, run_id)
            action = resume_action(bool(live), attempts)
            if action is ResumeAction.EXHAUSTED:
                self._finish(conn, run_id, RunStatus.FAILED, lock["generation"], now, error={
                    "code": "microvm_resume_exhausted", "attempts": attempts,
                    "message": f"the run's workload did not finish in {attempts} VMs"})
            if action is not ResumeAction.RESPAWN:
                return action, None
            generation = lock["generation"] + 1
            self._upsert_lock(conn, run_id, VM_LEASE_HOLDER, now + timedelta(seconds=boot_lease), generation)
            self._append(conn, run_id, None, None, EventKind.RUN_RECOVERED,
                         {"generation": generation, "tier": "microvm", "attempt": attempts + 1,
                          "resumed_steps": []}, generation, now)
            return action, self._insert_vm(conn, run_id, attempts + 1, generation, now)

    def take_vm(self, *, vm_id: str, host: str, token_hash: str, now: datetime) -> VmOrder | None:
        """A host takes a pending VM (the VM queue's task): booting, with the hash of the report
        token the host made. None for a VM already taken (a duplicate message) or reconciled."""
        with self._tx() as conn:
            row = conn.execute(runtime_vms.update().where(
                runtime_vms.c.id == vm_id, runtime_vms.c.state == VmState.PENDING,
            ).values(state=VmState.BOOTING, host=host, token_hash=token_hash, updated_at=now)
                .returning(runtime_vms)).mappings().first()
            if row is None:
                return None
            tenant = conn.execute(sa.select(runs.c.tenant_id).where(runs.c.id == row["run_id"])).scalar_one()
            return VmOrder(row["id"], row["run_id"], row["attempt"], row["generation"], row["spec"], tenant)

    def vm_started(self, *, vm_id: str, pid: int, now: datetime) -> None:
        with self._tx() as conn:
            # Its harness may have reported (and made it running) before the spawn returned.
            conn.execute(runtime_vms.update().where(
                runtime_vms.c.id == vm_id, runtime_vms.c.state.in_((VmState.BOOTING, VmState.RUNNING)))
                .values(state=VmState.RUNNING, pid=pid, updated_at=now))

    def vm_failed_to_start(self, *, vm_id: str, error: str, now: datetime) -> None:
        with self._tx() as conn:
            conn.execute(runtime_vms.update().where(runtime_vms.c.id == vm_id,
                                                    runtime_vms.c.state.in_(LIVE_STATES))
                         .values(state=VmState.FAILED, error=error[:2000], updated_at=now))

    def vm_by_token(self, token_hash: str) -> VmRecord | None:
        """The VM whose report token hashes to `token_hash`, with its run's tenant."""
        with self._tx() as conn:
            row = conn.execute(sa.select(*_VM_COLUMNS).join(runs, runs.c.id == runtime_vms.c.run_id)
                               .where(runtime_vms.c.token_hash == token_hash)).mappings().first()
            return _record(row) if row is not None else None

    def vms(self, run_id: str) -> list[VmRecord]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(*_VM_COLUMNS).join(runs, runs.c.id == runtime_vms.c.run_id)
                                .where(runtime_vms.c.run_id == run_id).order_by(runtime_vms.c.attempt))
            return [_record(r) for r in rows.mappings()]

    def vm_report(self, vm: VmRecord, fence: Fence, *, heartbeat: bool = False,
                  step: tuple[str, str, Any] | None = None) -> bool:
        """A heartbeat (renews the run's lease) or a step event (`started`, `completed` with its
        output, `failed` with its error), fenced on the VM's generation; False when fenced out,
        and then nothing is written. A step completed twice is journaled once."""
        with self._tx() as conn:
            if not self._fence(conn, fence):
                return False
            conn.execute(runtime_vms.update().where(runtime_vms.c.id == vm.id,
                                                    runtime_vms.c.state.in_(LIVE_STATES))
                         .values(last_heartbeat=fence.now, updated_at=fence.now, state=VmState.RUNNING))
            if step is not None:
                step_id, event, detail = step
                kind, payload = {
                    "started": (EventKind.STEP_STARTED, {"attempt": vm.attempt, "worker": f"vm:{vm.id}"}),
                    "completed": (EventKind.STEP_COMPLETED, {"output": json_safe(detail)}),
                    "failed": (EventKind.STEP_FAILED, {"error": {"message": str(detail)[:2000],
                                                                 "code": "workload_step_failed"}}),
                }[event]
                self._append(conn, vm.run_id, step_id, vm.attempt, kind, payload, fence.generation, fence.now,
                             on_conflict_skip=True)
                if event == "started":
                    conn.execute(runs.update()
                                 .where(runs.c.id == vm.run_id, runs.c.status == RunStatus.QUEUED)
                                 .values(status=RunStatus.RUNNING, started_at=fence.now))
            return True

    def vm_exited(self, vm: VmRecord, fence: Fence, *, code: int, output: Any) -> bool:
        """The workload exited: 0 finishes the run with `output`; anything else marks the VM failed
        and lets the lease lapse now, so the sweep resumes the run in a new VM. A VM fenced out
        (an earlier attempt) only records its own end."""
        with self._tx() as conn:
            state = VmState.TERMINATED if code == 0 else VmState.FAILED
            conn.execute(runtime_vms.update().where(runtime_vms.c.id == vm.id)
                         .values(state=state, exit_code=code, updated_at=fence.now,
                                 error=None if code == 0 else f"the workload exited with {code}"))
            if not self._fence(conn, fence):
                return False
            if code == 0:
                self._finish(conn, vm.run_id, RunStatus.SUCCEEDED, fence.generation, fence.now,
                             output=json_safe(output))
            else:
                conn.execute(run_locks.update().where(run_locks.c.run_id == vm.run_id)
                             .values(expires_at=fence.now))
            return True

    def completed_outputs(self, run_id: str) -> Mapping[str, Any]:
        """Every completed step's output: what the SDK reads back on a resume."""
        with self._tx() as conn:
            return dict(self._completed(conn, run_id))

    def _vm_count(self, conn: sa.Connection, run_id: str) -> int:
        count: int = conn.execute(sa.select(sa.func.count()).select_from(runtime_vms)
                                  .where(runtime_vms.c.run_id == run_id)).scalar_one()
        return count

    def _insert_vm(self, conn: sa.Connection, run_id: str, attempt: int, generation: int,
                   now: datetime) -> VmOrder:
        spec = conn.execute(sa.select(runs.c.graph).where(runs.c.id == run_id)).scalar_one()
        vm_id = f"vm_{uuid.uuid4().hex}"
        conn.execute(runtime_vms.insert().values(
            id=vm_id, run_id=run_id, attempt=attempt, generation=generation,
            driver=spec.get("driver", "namespace"),
            state=VmState.PENDING, spec=spec, created_at=now, updated_at=now))
        return VmOrder(vm_id, run_id, attempt, generation, spec)


def _record(row: sa.RowMapping) -> VmRecord:
    return VmRecord(id=row["id"], run_id=row["run_id"], tenant_id=row["tenant_id"], attempt=row["attempt"],
                    generation=row["generation"], driver=row["driver"], state=row["state"], host=row["host"],
                    pid=row["pid"], exit_code=row["exit_code"], error=row["error"],
                    last_heartbeat=row["last_heartbeat"], created_at=row["created_at"])
