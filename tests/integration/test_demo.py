"""`pal demo` (what `make demo` runs) on the embedded default, as a newcomer sees it: the worker is
killed mid-step and the sweep recovers the run without re-running finished steps, the approvals are
shown and decided, and every command the demo suggests works when pasted into a shell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_the_demo_crashes_recovers_decides_and_suggests_commands_that_work(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAL_")}  # the embedded default
    env["PYTHONPATH"] = str(REPO)  # PAL itself from what `make` installed, as on a newcomer's machine
    demo = subprocess.run([sys.executable, "-m", "pal.cli", "demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr
    assert f"journal sqlite:///{tmp_path}/.pal/pal.db" in out and (tmp_path / ".pal" / "pal.db").exists()
    assert "broker filesystem://" in out  # no server of any kind: the workers it starts itself

    # The crash: the worker was killed while T-1003 ran its slow lookup; the sweep took the run over.
    assert re.search(r">>> CRASH: kill -9 the worker \(pid \d+ and its pool children\) while \[T-1003\] "
                     r"runs 'customer'", out)
    assert re.search(r">>> RECOVERY: .* took over \[T-1003\] at lease generation 2; it resumes customer",
                     out)
    assert "[T-1003] ↻ run_recovered generation 2" in out
    # ... and only the cut-off call ran twice: the ledger the tools append to says so.
    assert "lookup_customer('initech'): 2 (the call the crash cut off, then its re-run)" in out
    assert re.findall(r"classify_ticket\('[^']*'\): (\d+)", out) == ["1", "1", "1"]
    assert "lookup_customer('acme'): 1" in out and "lookup_customer('globex'): 1" in out

    # The approvals: the prompt, what it shows, the command a person types, the decision.
    approvals = re.findall(r">>> APPROVAL: \[(T-\d+)\] waits at 'page_ok': Page on-call for ticket \1", out)
    assert sorted(approvals) == ["T-1001", "T-1003"]
    assert re.search(r"a person decides with: \S*pal runs approve run_\w+ page_ok", out)
    assert re.search(r"a person decides with: \S*pal runs reject run_\w+ page_ok", out)
    assert "page_on_call('T-1003'): 1" in out and "page_on_call('T-1001')" not in out  # rejected
    assert "3 of 3 runs succeeded" in out and out.count("run_succeeded") >= 3

    # Every suggested command, pasted as printed, from the folder the demo ran in.
    suggested = out.split("Look around", 1)[1].splitlines()[1:]
    commands = [line.strip() for line in suggested if line.startswith("  ")]
    assert len(commands) == 4 and all(" runs " in c or c.endswith(" doctor") for c in commands)
    for command in commands:
        pasted = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        assert pasted.returncode == 0, (command, pasted.stdout, pasted.stderr)
        if " runs show " in command:
            assert "succeeded" in pasted.stdout
        if " runs events " in command:
            assert "run_recovered" in pasted.stdout
