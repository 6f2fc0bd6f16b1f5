"""`pal tokens create`: the secret on the last line of stdout, and a note when the token's tenant is
not the one this shell starts runs as (its dashboard would show none of them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import Backend


def create(backend: Backend, cwd: Path, tenant: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pal.cli", "tokens", "create", "--tenant", tenant],
                          env=backend.env() | env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_token_for_another_tenant_says_where_this_shells_runs_go(postgres_backend: Backend,
                                                                  tmp_path: Path) -> None:
    other = create(postgres_backend, tmp_path, "acme", PAL_TENANT="default")
    assert other.returncode == 0, other.stderr
    assert other.stdout.splitlines()[-1].startswith("pal_")  # the secret, last, as scripts read it
    assert "runs started from this shell go to tenant 'default'" in other.stderr
    assert "PAL_TENANT=acme" in other.stderr
    same = create(postgres_backend, tmp_path, "acme", PAL_TENANT="acme")
    assert same.returncode == 0 and "note:" not in same.stderr
