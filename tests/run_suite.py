"""`make test`'s runner: the whole suite in three lanes at once, then the tests that need the machine
to themselves, alone. Run as `python -m tests.run_suite [--lowest] [PYTEST ARGS]`.

Why lanes: the end-to-end tests mostly wait (for worker processes, recoveries, a browser), and the
rest (unit, storage, architecture, integration) mostly compute, so on two cores the two halves side
by side take about as long as the longer one. The emulated microVM's test (`qemu`) is a third lane
beside them: it computes for about 45 s. Every test has its own Postgres schema, Redis key prefix
and folder (tests/conftest.py), and each lane its own pytest temporary folder, so the lanes never
see each other's data. The `disruptive` tests run last, by themselves: they restart the Postgres
server every test shares.

The microVM test once ran alone too: its VMs had failed to boot side by side with the lanes (3 in
one run). A guest kernel that cannot measure its TSC never boots (docs/isolated-tier.md); it is now
told the rate, and the test passed beside two busy loops (51 s, against 41 s on an idle machine).

Each line of a lane's output is shown as it comes, prefixed with the lane's name; the exit code
is the first failure's (0 when every phase passed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# End-to-end files the core lane takes, so that both lanes take about as long (measured side by
# side on a slower machine, 2026-12-06: core 13.2 min and e2e 10.4 with test_prune_cli.py here too,
# which takes about 1.5 min).
BALANCE = ["tests/e2e/test_side_effect_crashes.py"]
ALONE = "disruptive"
EVERY_OTHER = ["-m", f"not ({ALONE} or qemu)"]
LANES = {
    "e2e": ["tests/e2e", *(f"--ignore={path}" for path in BALANCE), *EVERY_OTHER],
    "core": ["tests/unit", "tests/storage", "tests/architecture", "tests/integration", *BALANCE, *EVERY_OTHER],
    "vm": ["tests/e2e/test_isolated_tier.py", "tests/e2e/test_sandbox_escapes.py", "-m", "qemu"],
}


def suite_environment() -> dict[str, str]:
    """This environment, with Python's bytecode cache on: the suite starts hundreds of `pal`
    processes (workers, beat, servers, commands), and with PYTHONDONTWRITEBYTECODE set (as some
    machines set it) each compiled PAL's own modules again, about 0.2 s of CPU apiece on a suite that
    is CPU-bound. The cache lands in __pycache__ folders, which git ignores."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONUNBUFFERED": "1"}


def pytest(name: str, args: list[str], basetemp: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pytest", *args, f"--basetemp={basetemp / name}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=suite_environment())


def relay(name: str, process: subprocess.Popen[str], tail: dict[str, str], lock: threading.Lock) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()
        if line.strip():
            tail[name] = line.strip()


def run_phase(lanes: dict[str, list[str]], basetemp: Path) -> dict[str, tuple[int, float, str]]:
    """Run each lane's pytest at once; (exit code, seconds, last line) of each."""
    started, tail, lock = time.monotonic(), {}, threading.Lock()
    processes = {name: pytest(name, args, basetemp) for name, args in lanes.items()}
    relays = [threading.Thread(target=relay, args=(name, p, tail, lock), daemon=True)
              for name, p in processes.items()]
    for thread in relays:
        thread.start()
    results = {}
    for name, process in processes.items():
        code = process.wait()
        results[name] = (code, time.monotonic() - started, tail.get(name, ""))
    for thread in relays:
        thread.join(timeout=5)
    return results


def main(argv: list[str]) -> int:
    # --lowest (`make test-lowest`): the core and end-to-end lanes only, on the lowest supported
    # Celery/kombu/app stack (constraints-lowest.txt); the microVM and Postgres-restarting tests
    # do not depend on those versions and run in `make test`.
    lowest = "--lowest" in argv
    argv = [arg for arg in argv if arg != "--lowest"]
    basetemp = Path(tempfile.mkdtemp(prefix="pal-suite-"))
    # Compiled once, before the lanes start, so that no two lanes race to write one file.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "src", "tests"], cwd=REPO, check=True,
                   env=suite_environment())
    # There, the fast publisher's own tests are deselected: kombu 5.5 turns that path off.
    lanes = {name: [*(f"not ({ALONE} or qemu or fast_publisher)" if lowest and arg == EVERY_OTHER[1] else arg
                      for arg in paths), *argv]
             for name, paths in LANES.items() if not (lowest and name == "vm")}
    results = run_phase(lanes, basetemp)
    if not lowest:
        results |= run_phase({"alone": ["tests", "-m", ALONE, *argv]}, basetemp)
    print("\nsuite:", flush=True)
    for name, (code, seconds, last) in results.items():
        print(f"  {name:<10} {'passed' if code == 0 else f'FAILED (exit {code})':<16} {seconds:6.0f}s  {last}")
    return next((code for code, _, _ in results.values() if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
