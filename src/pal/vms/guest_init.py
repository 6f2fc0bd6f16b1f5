"""The workload's launcher inside a `qemu-microvm` guest (run by the guest image's /init, chrooted
into the host's root filesystem shared read-only over 9p; docs/isolated-tier.md).

`python -m pal.vms.guest_init WORKDIR PORT`: reads WORKDIR/.pal/launch.json (written by the host's
harness: the command, its environment, the resume flag), runs the command in WORKDIR with the SDK's
channel being PORT (the virtio-serial port named `pal`), and exits with the command's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(workdir: str, port: str) -> int:
    with open(os.path.join(workdir, ".pal", "launch.json")) as launch:
        spec = json.load(launch)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, **spec.get("env", {}),
           "PAL_RESUME": "1" if spec.get("resume") else "0", "PAL_HARNESS_SOCKET": port}
    return subprocess.run(spec["command"], cwd=workdir, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
