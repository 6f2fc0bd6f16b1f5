"""Postgres only: `pal_claim_step_after`, the one-call claim that also checks that the steps the
caller's log has not seen complete did complete.

A worker's step log is behind when another worker completed the step's predecessor (two solo
workers share the runs of a busy queue). The claim used to read the log first (`pal_read_log`, one
more round trip) to see that the step is ready. Now the plan names the steps whose completion
alone makes it ready (`Program.needs`), and the statement that takes the fence checks them: a
missing one refuses the claim with nothing written and the lease untouched. `pal_claim_step`
stays, as that claim with nothing to check, for workers that predate this migration during a
rolling upgrade (docs/architecture.md, "The life of one step"). Loads pal/storage/sql/functions.sql
as migration 0009 explains.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from alembic import op

from pal.storage.sql import load_functions

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

SQL_SHA256 = "654e2cc59da292a8933dafbb47387f85a014e634128e85ce88e2efb9d645962d"


def upgrade() -> None:
    load_functions(op.execute, op.get_bind().dialect.name)


def downgrade() -> None:
    pass  # pal_claim_step keeps its meaning for older code; pal_claim_step_after is left unused
