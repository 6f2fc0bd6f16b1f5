"""The journal: PAL's whole storage, one object joining the stores by operation family.

    StepStore      claim, complete, retry, fail, doubt, heartbeat      pal.storage.steps
    WaitStore      park and resume steps; wake-up timers               pal.storage.waits
    RunStore       create and cancel runs; runs, events and leases     pal.storage.runs
    LineageStore   retried and forked runs; runs derived from a run    pal.storage.lineage
    RetentionStore prune finished run families; pruned ids, receipts  pal.storage.retention
    RecoveryStore  steal leases, redeliver, find orphans               pal.storage.recovery
    ReceiptStore   side-effect receipts                                pal.storage.receipts
    TokenStore     API tokens and the doorbell key                     pal.storage.tokens
    AnomalyStore   anomalies, each journaled once                      pal.storage.anomalies
    ConfidenceStore the confidence gate's evaluations, once per step   pal.storage.confidence
    BaselineStore  recent per-node tokens and cost                     pal.storage.baselines
    VmStore        the isolated tier's VMs, reports, resumeMicroVMRun  pal.storage.vms
    Doctor         the journal's invariants                            pal.storage.doctor

Each store is a class of its own module over the shared state and reads of pal.storage.base and
the in-transaction writes of pal.storage.primitives; `Journal` only joins them, so callers hold one
object and the caches (step logs, plan documents) are shared by every family. A new capability
adds a store module and a base here (docs/architecture.md, "Storage").
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from pal.storage.anomalies import AnomalyStore
from pal.storage.baselines import BaselineStore
from pal.storage.confidence import ConfidenceStore
from pal.storage.doctor import Doctor, ProgramOf
from pal.storage.lineage import LineageStore
from pal.storage.receipts import ReceiptStore
from pal.storage.recovery import RecoveryStore
from pal.storage.retention import RetentionStore
from pal.storage.runs import RunStore
from pal.storage.steps import StepStore
from pal.storage.tokens import TokenStore
from pal.storage.vms import VmStore
from pal.storage.waits import WaitStore


class Journal(StepStore, WaitStore, LineageStore, RetentionStore, RunStore, RecoveryStore, ReceiptStore,
              AnomalyStore, ConfidenceStore, BaselineStore, VmStore, TokenStore, Doctor):
    """Named operations on the journal database. Time is always passed in (`now`, or a Fence)."""

    def __init__(self, engine: Engine, program_of: ProgramOf | None = None) -> None:
        super().__init__(engine)
        self._program_of = program_of
