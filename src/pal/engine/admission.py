"""Admission (pal.core.admission): what a new run heeds (its tenant's PAL_TENANT_CONCURRENCY, its
graph's `concurrency` key, its priority), and the passes that give freed slots to held runs and ring
their first doorbells: after a top-level run of a limited tenant or key ends, and at every sweep."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pal.core.admission import DEFAULT_PRIORITY, MAX_KEY_CHARS, Admission, pool_key, priority_problem
from pal.core.clock import utcnow
from pal.core.records import RunRecord
from pal.core.templates import render_string
from pal.engine.runtime import Runtime
from pal.errors import InputError, PalError, TemplateError

log = logging.getLogger(__name__)


def admission_of(rt: Runtime, document: Any, run_input: Any, tenant_id: str, priority: Any) -> Admission:
    """The new run's admission: InputError (nothing written) for a bad priority, or a concurrency key
    that does not render to a short string or number."""
    problem = priority_problem(priority, "a run's priority")
    if problem:
        raise InputError(problem)
    graph = document if isinstance(document, Mapping) else {}
    chosen = priority if priority is not None else graph.get("priority") or DEFAULT_PRIORITY
    block = graph.get("concurrency")
    key = pool_key(_key(block["key"], run_input), block["limit"]) if isinstance(block, Mapping) else None
    return Admission(priority=chosen, tenant_limit=rt.settings.admission.limit_of(tenant_id), key=key,
                     key_limit=block["limit"] if isinstance(block, Mapping) else None)


def _key(template: str, run_input: Any) -> str:
    if "secrets" in template:  # a key is stored in the clear: no secret may render into one
        raise InputError("a concurrency key may not use secrets")
    try:
        value = render_string(template, {"input": run_input})
    except TemplateError as exc:
        raise InputError(f"the concurrency key did not render: {exc}") from None
    text = str(value)
    scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
    if not scalar or not 0 < len(text) <= MAX_KEY_CHARS:
        raise InputError(f"the concurrency key must render to a string or number of 1 to {MAX_KEY_CHARS} "
                         "characters")
    return text


def admit(rt: Runtime, tenant_id: str) -> list[str]:
    """One admission pass for the tenant; ring the first doorbell of each run admitted. A doorbell
    the broker refuses is rung again by the orphan sweep once the run's first lease lapses."""
    limit = rt.settings.admission.limit_of(tenant_id)
    admitted = rt.journal.admission.admit(tenant_id=tenant_id, tenant_limit=limit, now=utcnow(),
                                          lease_ttl=rt.settings.lease_ttl)
    ring_first_steps(rt, admitted)
    return admitted


def ring_first_steps(rt: Runtime, run_ids: Iterable[str]) -> None:
    for run_id in run_ids:
        try:
            run = rt.journal.runs.get_run(run_id)
            rt.publish(run_id, rt.program_of(run).first_step, 1)
        except PalError:
            log.warning("run %s admitted, its first doorbell not rung; the sweep rings it", run_id,
                        exc_info=True)


def after_run_ended(rt: Runtime, run: RunRecord) -> None:
    """A top-level run that heeded a limit ended: its slot goes to the next held run."""
    if run.parent_run_id is None and run.admitted is not None:
        try:
            admit(rt, run.tenant_id)
        except PalError:
            log.warning("admission after run %s ended failed; the sweep admits", run.id, exc_info=True)


def admit_everywhere(rt: Runtime) -> int:
    """The sweep's pass: every tenant with held runs (longest waiting first); how many runs were
    admitted. One tenant's failure is its own."""
    admitted = 0
    for tenant in rt.journal.admission.tenants_waiting():
        try:
            admitted += len(admit(rt, tenant))
        except PalError:
            log.warning("sweep: admission for tenant %s failed; the next pass retries", tenant, exc_info=True)
    return admitted
