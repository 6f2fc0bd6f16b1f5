"""The stable names of PAL's Celery tasks: other services `send_task` them without importing PAL."""

from __future__ import annotations

EXECUTE_NODE = "pal.execute_node"  # one step of one run: the doorbell
SWEEP_ORPHANS = "pal.sweep_orphans"  # one pass of the orphan sweep (celery beat)
START_RUN = "pal.start_run"  # validate and start a run from a message
SIGNAL = "pal.signal"  # send a signal to a run (its wait_event steps) from a message
FIRE_SCHEDULES = "pal.fire_schedules"  # start the runs of due schedule ticks (celery beat)
RECOMPUTE_BASELINES = "pal.recompute_baselines"  # per-node baselines of tokens and cost (beat)
SPAWN_VM = "pal.spawn_vm"  # start one VM of a microVM run, on PAL_VM_QUEUE (a VM host)

# A doorbell's header: when it was published, or is due (a countdown's end), as Unix seconds. A step
# span's queue wait is measured from it (docs/observability.md); it proves nothing and gates nothing.
SENT_AT_HEADER = "pal_sent_at"
# An own message's request attribute, never a header: the claim its completion took for the thread
# that runs it (pal.core.records.ClaimAhead, an object no message can carry).
CLAIM_AHEAD = "pal_claim_ahead"
# A request attribute a solo worker sets, never a header: the step's chance to take back the message
# it runs next (pal.workers.publishing.TakeBack, an object no message can carry).
RUNS_NEXT = "pal_runs_next"
