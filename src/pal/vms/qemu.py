"""The `qemu-microvm` driver's command line (docs/isolated-tier.md).

A KVM microVM booted from the guest of pal.vms.guest_image: the sandbox's view (pal.vms.sandbox)
shared read-only over 9p as the guest's root, the work directory shared writable, two
virtio-serial ports connected to the harness's sockets (`pal`, the SDK's channel, and `pal-ctl`,
the guest init's: the launch order and the exit code, root-only in the guest), no network device,
gone when it powers off; on KVM unless PAL_VM_ACCEL says tcg. qemu runs in a mount namespace of its
own where the view is made, so the guest sees nothing else of the host.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pal.vms import DriverError
from pal.vms.sandbox import python_paths, view_script

QEMU_OVERHEAD_MB = 256  # what qemu itself needs beside its guest's memory, in the VM's cgroup


def option(value: str) -> str:
    """A value inside a qemu option string: a comma is doubled, which qemu reads as a literal comma."""
    return value.replace(",", ",,")


def _kernel_word(name: str, value: str) -> str:
    if not value or any(c.isspace() or c in "\"'\\" for c in value) or not value.isprintable():
        raise DriverError(f"{name} {value!r} cannot go on a kernel command line (space, quote or control)")
    return f"{name}={value}"


def microvm(*, guest: Path, view: Path, work_fd: int, sdk_socket: Path, ctl_socket: Path,
            accel: str, memory_mb: int, cpus: int, uid: int, extra: tuple[str, ...]) -> list[str]:
    """The harness's command for one microVM: `unshare --mount` making the view, then qemu."""
    cpu = "host" if accel == "kvm" else "max"
    append = ["console=ttyS0", "panic=-1", "quiet", _kernel_word("pal.python", sys.executable),
              f"pal.uid={uid}"]
    if kept := kept_under_tmp():
        append.append(_kernel_word("pal.keep", kept))
    if accel == "tcg" and (khz := host_tsc_khz()):
        append.append(f"tsc_early_khz={khz}")
    qemu = ["qemu-system-x86_64", "-M", f"microvm,accel={accel}", "-cpu", cpu, "-m", str(memory_mb),
            "-smp", str(cpus), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(guest / "vmlinuz"), "-initrd", str(guest / "initrd.img"),
            "-append", " ".join(append),
            "-serial", "stdio",  # the harness keeps the console in its log, bounded
            "-fsdev", f"local,id=hostroot,path={option(str(view))},security_model=none,readonly=on,"
                      "multidevs=remap",
            "-device", "virtio-9p-device,fsdev=hostroot,mount_tag=hostroot",
            "-fsdev", f"local,id=work,path=/proc/self/fd/{work_fd},security_model=none",
            "-device", "virtio-9p-device,fsdev=work,mount_tag=work",
            "-device", "virtio-serial-device",
            "-chardev", f"socket,id=pal,path={option(str(sdk_socket))}",
            "-device", "virtserialport,chardev=pal,name=pal",
            "-chardev", f"socket,id=palctl,path={option(str(ctl_socket))}",
            "-device", "virtserialport,chardev=palctl,name=pal-ctl"]
    script = (f"set -eu\nR={shlex.quote(str(view))}\n" + view_script(extra, private_tmp=False)
              + '\nmount -o remount,ro,bind "$R"\nexec "$@"\n')
    return ["unshare", "--mount", "sh", "-c", script, "pal-microvm", *qemu]


def host_tsc_khz(cpuinfo: str = "/proc/cpuinfo") -> int | None:
    """The host's TSC rate in kHz, which an emulated guest's TSC runs at (qemu's TCG reads the host's
    counter), where the host says it (`constant_tsc`, then its first `cpu MHz`); else None.

    Why: a microVM has no PIT, HPET or ACPI PM timer, so an emulated guest kernel cannot measure its
    TSC; where its CPUID does not say the rate either, the boot waits for a timer tick that never
    comes. Told the rate (`tsc_early_khz`), it boots in seconds."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    mhz = next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("cpu MHz")), "")
    try:
        khz = round(float(mhz) * 1000)
    except ValueError:
        return None
    return khz if "constant_tsc" in flags.split() and khz > 0 else None


def kept_under_tmp() -> str:
    """The host folders a guest must still see under its private /tmp (its /init mounts a fresh
    tmpfs there): the Python environment and the folder `pal` is imported from, when they live
    under the host's /tmp (a checkout or a virtualenv there), colon-separated; "" for none."""
    return ":".join(p for p in python_paths() if p.startswith("/tmp/"))
