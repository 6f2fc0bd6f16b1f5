"""Who a decision or a cancel is recorded as when no one is named (pal.client)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys


def test_who_decides_defaults_to_the_processs_account_when_user_is_unset() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "LNAME", "USERNAME")}
    out = subprocess.run([sys.executable, "-c", "from pal.client import _user; print(_user())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == pwd.getpwuid(os.getuid()).pw_name  # never "unknown"


def test_a_named_user_is_who_decides() -> None:
    env = {**os.environ, "USER": "ada"}
    out = subprocess.run([sys.executable, "-c", "from pal.client import _user; print(_user())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ada"
