"""The workload's launcher inside a `qemu-microvm` guest (run as the guest's root by the guest image's
/init, chrooted into the harness's view of the host; docs/isolated-tier.md).

`python -m pal.vms.guest_init PORT CTL UID`: asks the harness for the launch order over CTL (the
root-only `pal-ctl` port: the command, its environment, the resume flag), runs the command in the
work directory as UID, without capabilities, under PAL's seccomp filter, with the SDK's channel
being PORT, and tells the harness its exit code over CTL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pal.vms.sandbox import WORK

_MAX_LINE = 1 << 20


def _drop(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from root to a plain user: every capability goes


def main(port: str, ctl: str, uid: int) -> int:
    with open(ctl, "r+b", buffering=0) as channel:
        channel.write(b'{"op": "launch"}\n')
        order: dict[str, Any] = json.loads(channel.readline(_MAX_LINE))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, **order.get("env", {}),
               "PAL_RESUME": "1" if order.get("resume") else "0", "PAL_HARNESS_SOCKET": port}
        confine = str(Path(__file__).with_name("confine.py"))
        code = subprocess.run([sys.executable, "-I", "-S", confine, *order["command"]], cwd=WORK, env=env,
                              check=False, preexec_fn=lambda: _drop(uid)).returncode
        code = 128 - code if code < 0 else code
        channel.write(json.dumps({"op": "exit", "code": code}).encode() + b"\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
