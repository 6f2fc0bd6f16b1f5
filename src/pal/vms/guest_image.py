"""The `qemu-microvm` driver's guest, built reproducibly from Debian packages
(`python -m pal.vms.guest_image OUT`; `make vm-guest`; docs/isolated-tier.md).

From `linux-image-amd64` (the kernel and the modules it needs for virtio-mmio, 9p and virtio
consoles) and `busybox-static`, both fetched with `apt-get download` and unpacked with `dpkg -x`
(never installed), it writes OUT/vmlinuz and OUT/initrd.img: a gzip'd newc cpio whose /init loads
the modules, mounts the harness's view of the host read-only and the run's work directory writable
over 9p, runs the workload there as an unprivileged user (`pal.vms.guest_init` under the host's
Python, which reports the exit code over the root-only `pal-ctl` port) and powers the VM off. Every
file of the archive has a fixed mtime, owner and order, so the same packages give the same bytes.
"""

from __future__ import annotations

import gzip
import io
import lzma
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ("linux-image-amd64", "busybox-static")
MODULES = ("virtio_mmio", "virtio_console", "9pnet_virtio", "9p")

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# virtio-mmio devices are announced on the command line (virtio_mmio.device=...):
# a module loaded by insmod gets its parameters only as arguments
MMIO=$(for a in $(cat /proc/cmdline); do
  case "$a" in virtio_mmio.device=*) echo "device=${a#*=}";; esac
done)
for m in $(cat /modules.load); do
  if [ "$m" = virtio_mmio.ko ]; then insmod "/modules/$m" $MMIO; else insmod "/modules/$m"; fi
done
mkdir -p /host
# The host's view for this VM (the harness made it: system files and Python, read-only), as root.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot /host \
  || { echo "pal-init: no host root"; poweroff -f; }
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
# The guest's /tmp is its own memory; host folders it must still see there (the Python environment
# or checkout, when under the host's /tmp: pal.keep=a:b) are bound back, read-only like the rest.
KEEP=$(for arg in $(cat /proc/cmdline); do
  case "$arg" in pal.keep=*) echo "${arg#pal.keep=}" | tr ':' ' ';; esac
done)
N=0
for k in $KEEP; do N=$((N+1)); mkdir -p "/keep/$N"; mount -o bind "/host$k" "/keep/$N"; done
mount -t tmpfs tmpfs /host/tmp
N=0
for k in $KEEP; do N=$((N+1)); mkdir -p "/host$k"; mount -o bind "/keep/$N" "/host$k"; done
mount -t 9p -o trans=virtio,version=9p2000.L work /host/run/pal/work \
  || { echo "pal-init: no work share"; poweroff -f; }
PORT=""; CTL=""
for p in /sys/class/virtio-ports/*; do
  case "$(cat "$p/name")" in pal) PORT="/dev/$(basename "$p")";; pal-ctl) CTL="/dev/$(basename "$p")";; esac
done
PY=$(for arg in $(cat /proc/cmdline); do case "$arg" in pal.python=*) echo "${arg#pal.python=}";; esac; done)
U=$(for arg in $(cat /proc/cmdline); do case "$arg" in pal.uid=*) echo "${arg#pal.uid=}";; esac; done)
# The workload's channel is its own; the launcher's stays root's.
chown "$U:$U" "/host$PORT" && chmod 600 "/host$PORT" "/host$CTL"
chroot /host "$PY" -m pal.vms.guest_init "$PORT" "$CTL" "$U"
sync
poweroff -f
"""


def _download(packages: tuple[str, ...], into: Path) -> list[Path]:
    if subprocess.run(["apt-get", "download", *packages], cwd=into, capture_output=True).returncode:
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True)  # a fresh machine
        subprocess.run(["apt-get", "download", *packages], cwd=into, check=True, capture_output=True)
    debs = sorted(into.glob("*.deb"))
    # linux-image-amd64 is a metapackage: fetch the kernel package it depends on
    meta = next(d for d in debs if d.name.startswith("linux-image-amd64"))
    depends = subprocess.run(["dpkg-deb", "-f", str(meta), "Depends"], capture_output=True, text=True,
                             check=True).stdout
    kernel = depends.split(",")[0].split("(")[0].strip()
    subprocess.run(["apt-get", "download", kernel], cwd=into, check=True, capture_output=True)
    return sorted(into.glob("*.deb"))


def _modules(root: Path) -> list[Path]:
    """MODULES and what they depend on (each module's own `depends=` in its .modinfo: the package
    ships no modules.dep, depmod makes that at install), in loading order."""
    files = {f.name.split(".ko")[0].replace("-", "_"): f for f in (root / "lib" / "modules").rglob("*.ko*")}
    order: list[Path] = []

    def visit(name: str) -> None:
        module = files[name]
        if module in order:
            return
        data = module.read_bytes()
        if module.name.endswith(".xz"):
            data = lzma.decompress(data)
        start = data.find(b"\0depends=")
        needs = data[start + 9:data.index(b"\0", start + 1)].decode() if start >= 0 else ""
        for need in filter(None, needs.split(",")):
            visit(need.replace("-", "_"))
        order.append(module)

    for name in MODULES:
        if name in files:  # one built into this kernel needs no loading
            visit(name)
    return order


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc archive of (path, mode, data); directories have no data. Fixed mtime, uid, gid."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        header = "070701" + "".join(f"{v:08x}" for v in (
            ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0))
        out.write(header.encode() + encoded)
        out.write(b"\0" * (-(110 + len(encoded)) % 4))
        out.write(data)
        out.write(b"\0" * (-len(data) % 4))
    return out.getvalue()


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = work / "root"
        for deb in _download(PACKAGES, work):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        vmlinuz = sorted((root / "boot").glob("vmlinuz-*"))[-1]
        shutil.copyfile(vmlinuz, out / "vmlinuz")
        modules = _modules(root)
        entries: list[tuple[str, int, bytes]] = [(d, 0o40755, b"") for d in (
            "bin", "dev", "proc", "sys", "host", "modules")]
        decompressed = []
        for module in modules:
            data = module.read_bytes()
            name = module.name
            if name.endswith(".xz"):
                data, name = lzma.decompress(data), name[:-3]
            decompressed.append(name)
            entries.append((f"modules/{name}", 0o100644, data))
        entries.append(("modules.load", 0o100644, "\n".join(decompressed).encode() + b"\n"))
        entries.append(("bin/busybox", 0o100755, (root / "bin" / "busybox").read_bytes()))
        entries.append(("init", 0o100755, INIT.encode()))
        archive = _cpio(sorted(entries, key=lambda e: e[0]))
        with gzip.GzipFile(out / "initrd.img", "wb", mtime=0) as gz:
            gz.write(archive)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
    print(f"guest built in {sys.argv[1]}")
