"""The journal: PAL's whole storage, a small facade over one store per operation family.

    journal.steps       claim, complete, retry, fail, doubt, heartbeat      pal.storage.steps
    journal.waits       park and resume steps; wake-up timers               pal.storage.waits
    journal.runs        create and cancel runs; runs, events and leases     pal.storage.runs
    journal.lineage     retried and forked runs; runs derived from a run    pal.storage.lineage
    journal.retention   prune finished run families; pruned ids, receipts  pal.storage.retention
    journal.recovery    steal leases, redeliver, find orphans               pal.storage.recovery
    journal.receipts    side-effect receipts                                pal.storage.receipts
    journal.tokens      API tokens and the doorbell key                     pal.storage.tokens
    journal.anomalies   anomalies, each journaled once                      pal.storage.anomalies
    journal.confidence  the confidence gate's evaluations, once per step   pal.storage.confidence
    journal.baselines   recent per-node tokens and cost                     pal.storage.baselines
    journal.vms         the isolated tier's VMs, reports, resumeMicroVMRun  pal.storage.vms
    journal.doctor      the journal's invariants                            pal.storage.doctor

Each store is a class of its own module over the shared reads of pal.storage.base and the
in-transaction writes of pal.storage.primitives; the stores of one journal share its caches (step
logs, plan documents, first-read runs). A new capability adds a store module and an attribute here
(docs/architecture.md, "Storage").
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from pal.storage.admission import AdmissionStore
from pal.storage.anomalies import AnomalyStore
from pal.storage.base import Caches, StoreBase
from pal.storage.baselines import BaselineStore
from pal.storage.confidence import ConfidenceStore
from pal.storage.doctor import Doctor, ProgramOf
from pal.storage.lineage import LineageStore
from pal.storage.one_call import AutocommitCalls
from pal.storage.receipts import ReceiptStore
from pal.storage.recovery import RecoveryStore
from pal.storage.retention import RetentionStore
from pal.storage.runs import RunStore
from pal.storage.schedules import ScheduleStore
from pal.storage.signals import SignalStore
from pal.storage.steps import StepStore
from pal.storage.tokens import TokenStore
from pal.storage.vms import VmStore
from pal.storage.waits import WaitStore


class Journal:
    """Named operations on the journal database, by family. Time is always passed in (`now`, or a
    Fence)."""

    def __init__(self, engine: Engine, program_of: ProgramOf | None = None) -> None:
        self.engine = engine
        caches = Caches()
        self.steps = StepStore(engine, caches)
        self.waits = WaitStore(engine, caches)
        self.signals = SignalStore(engine, caches)
        self.schedules = ScheduleStore(engine, caches)
        self.admission = AdmissionStore(engine, caches)
        self.runs = RunStore(engine, caches)
        self.lineage = LineageStore(engine, caches)
        self.retention = RetentionStore(engine, caches)
        self.recovery = RecoveryStore(engine, caches)
        self.receipts = ReceiptStore(engine, caches)
        self.tokens = TokenStore(engine, caches)
        self.anomalies = AnomalyStore(engine, caches)
        self.confidence = ConfidenceStore(engine, caches)
        self.baselines = BaselineStore(engine, caches)
        self.vms = VmStore(engine, caches)
        self.doctor = Doctor(engine, caches, program_of)

    @property
    def calls(self) -> AutocommitCalls | None:
        """Postgres: the one-call claims' and completions' connections (None on SQLite)."""
        return self.steps.calls

    @calls.setter
    def calls(self, calls: AutocommitCalls | None) -> None:
        """None: every store takes its transactional path (the path-parity tests compare both)."""
        for store in vars(self).values():
            if isinstance(store, StoreBase):
                store.calls = calls
