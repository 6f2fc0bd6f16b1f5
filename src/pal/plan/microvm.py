"""A microVM run's plan: a program the engine never steps through (docs/isolated-tier.md).

Its steps are the workload's own, reported by its VM's harness; no `pal.execute_node` message may
start one, so this plan has no node and no step is ever ready for a worker's claim.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pal.core.records import Handoff
from pal.core.vms import VmSpec, microvm_problems, parse_spec
from pal.errors import GraphError
from pal.plan.model import Node


@dataclass(frozen=True)
class MicroVmProgram:
    spec: VmSpec

    @property
    def first_step(self) -> str:
        return ""

    def document(self) -> dict[str, Any]:
        return self.spec.document()

    @property
    def hash(self) -> str:
        canonical = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def node(self, step_id: str) -> Node:
        raise KeyError(f"a microVM run has no node {step_id!r}: its workload runs its steps")

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff:
        return Handoff(dispatch=(), finished=False)

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]:
        return ()

    def is_ready(self, completed: Mapping[str, Any], step_id: str) -> bool:
        return False  # a doorbell never starts a workload's step

    def needs(self, completed: Mapping[str, Any], step_id: str) -> frozenset[str] | None:
        return None

    def view(self, step_id: str, completed: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any]:
        return {}, None


def parse_microvm(document: Mapping[str, Any]) -> MicroVmProgram:
    problems = microvm_problems(document)
    if problems:
        raise GraphError(problems, what="microVM run")
    return MicroVmProgram(parse_spec(document))
