"""The workload's launcher inside a `qemu-microvm` guest (run as the guest's root by the guest image's
/init, chrooted into the harness's view of the host; docs/isolated-tier.md).

`python -m pal.vms.guest_init PORT CTL UID`: asks the harness for the launch order over CTL (the
root-only `pal-ctl` port: the command, its environment, the resume flag), runs the command in the
work directory as UID, without capabilities, under PAL's seccomp filter, with the SDK's channel
being PORT, and tells the harness its exit code over CTL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from pal.vms.sandbox import WORK, confined

_MAX_LINE = 1 << 20


def main(port: str, ctl: str, uid: int) -> int:
    with open(ctl, "r+b", buffering=0) as channel:
        channel.write(b'{"op": "launch"}\n')
        order: dict[str, Any] = json.loads(channel.readline(_MAX_LINE))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, **order.get("env", {}),
               "PAL_RESUME": "1" if order.get("resume") else "0", "PAL_HARNESS_SOCKET": port}
        code = subprocess.run(confined(order["command"], uid), cwd=WORK, env=env, check=False).returncode
        code = 128 - code if code < 0 else code
        channel.write(json.dumps({"op": "exit", "code": code}).encode() + b"\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
