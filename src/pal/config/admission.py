"""How many runs each tenant may have admitted at once (pal.engine.admission), checked when the
settings load.

PAL_TENANT_CONCURRENCY  runs of one tenant admitted at once; more wait, held, holding no worker and
                        no message (default 0: no limit)
PAL_TENANT_WEIGHTS      a JSON object of tenant -> weight multiplying that limit (a paying tier's
                        4 gets four times the runs), e.g. {"acme": 4, "free-tier": 0.5}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pal.errors import ConfigError

MAX_WEIGHTS = 10_000
MAX_WEIGHT = 1_000.0


@dataclass(frozen=True)
class AdmissionSettings:
    tenant_limit: int = 0  # 0: no tenant limit
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def limit_of(self, tenant_id: str) -> int | None:
        """The tenant's limit (at least 1), or None when tenants have none."""
        if not self.tenant_limit:
            return None
        return max(1, math.floor(self.tenant_limit * self.weights.get(tenant_id, 1.0)))


def load_admission(env: Mapping[str, str]) -> AdmissionSettings:
    raw_limit = env.get("PAL_TENANT_CONCURRENCY", "").strip() or "0"
    try:
        limit = int(raw_limit)
    except ValueError:
        raise ConfigError(f"PAL_TENANT_CONCURRENCY={raw_limit!r} is not a whole number") from None
    if not 0 <= limit <= 1_000_000:
        raise ConfigError(f"PAL_TENANT_CONCURRENCY={raw_limit!r} must be from 0 (no limit) to 1000000")
    raw_weights = env.get("PAL_TENANT_WEIGHTS", "").strip()
    weights: dict[str, float] = {}
    if raw_weights:
        try:
            parsed = json.loads(raw_weights)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"PAL_TENANT_WEIGHTS is not JSON: {exc}") from None
        if not isinstance(parsed, dict) or len(parsed) > MAX_WEIGHTS:
            raise ConfigError(f"PAL_TENANT_WEIGHTS is a JSON object of at most {MAX_WEIGHTS} tenants")
        for tenant, weight in parsed.items():
            if (isinstance(weight, bool) or not isinstance(weight, int | float)
                    or not 0 < weight <= MAX_WEIGHT or not 0 < len(tenant) <= 64):
                raise ConfigError(f"PAL_TENANT_WEIGHTS: tenant {tenant[:64]!r} needs a weight above 0 and at "
                                  f"most {MAX_WEIGHT:g}")
            weights[tenant] = float(weight)
    return AdmissionSettings(tenant_limit=limit, weights=MappingProxyType(weights))
