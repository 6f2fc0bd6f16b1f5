"""`approval`: park the run until a person decides, then follow the chosen branch.

The step journals `step_waiting {kind: "approval", prompt, requested_at, expires_at?, approval_hash}`
and the run waits with no lease and no worker held. A decision (`pal runs approve|reject`, the
client) journals `approval_decided {decision, by, comment}` and completes the step with
`{"branch": "approved" | "rejected" | "timeout", ...}`; edges leave by those sourceHandles. The hash
covers exactly what is approved (the rendered prompt and `show`), and a decision can pin it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from pal.nodes.base import ANY, Field, NodeKind, Park, StepContext, expiry, expiry_problems

BRANCHES = ("approved", "rejected", "timeout")


def approval_hash(prompt: Any, shown: Any) -> str:
    canonical = json.dumps({"prompt": prompt, "show": shown}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Approval(NodeKind):
    type_name = "approval"
    fields: ClassVar[Mapping[str, Field]] = {
        "prompt": Field((str,), required=True),
        "show": Field(ANY),
        "expiresIn": Field((str,), templated=False),
        "label": Field((str,), templated=False),
    }
    branches: ClassVar[tuple[str, ...]] = BRANCHES

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        return [*super().validate(data, known_tools), *expiry_problems(data)]

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        prompt = ctx.render(data["prompt"])
        shown = ctx.render(data.get("show"))
        now = ctx.now()
        payload: dict[str, Any] = {"kind": "approval", "prompt": prompt, "show": shown,
                                   "requested_at": now.isoformat(),
                                   "approval_hash": approval_hash(prompt, shown)}
        wake_at = expiry(data, now)
        if wake_at is not None:
            payload["expires_at"] = wake_at.isoformat()
        return Park(payload, wake_at)
