"""The storage under a model's directory, as one harness.formats.storage.Storage record.

`STORAGE_SCRIPT` is a constant POSIX sh script ($1: the model file's path) that prints, in one round trip: the
directory as the device resolves it, its device number (`stat -c %d`), /proc/self/mountinfo, `df -Pk`, the block
device behind that number (/sys/dev/block/MAJ:MIN, a partition resolved to its disk and a device-mapper device
to the disk under it through its slaves) with that disk's model, vendor, type and rotational flag, and a 4 KiB
read of the model file with `dd iflag=direct` (O_DIRECT). `parse_storage` (pure) reads that output: the mount is
the one with the longest mount point holding the directory (the device number breaks ties, the last mounted
wins), the kind comes from the disk's name and sysfs path (sd* under a UFS host is UFS, mmcblk* eMMC or SD, nvme*,
vd* or a virtio path, a tmpfs or ramfs is RAM).

The same script runs on this machine (`read_local`, through sh), where O_DIRECT is tried by Python itself: the
file opened with O_DIRECT and a page-aligned 4 KiB read. Everything read is bounded: the output to MAX_OUTPUT,
every field to harness.formats.storage.MAX_TEXT.
"""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
from dataclasses import dataclass

from harness.formats.storage import Storage, StorageKind

MAX_OUTPUT = 2 * 2**20  # mountinfo of a phone with its APEX mounts is ~100 KB
MAX_MOUNTS = 20000

STORAGE_SCRIPT = r"""f="$1"; T=$(printf '\t')
case "$f" in */*) d="${f%/*}";; *) d=.;; esac
[ -n "$d" ] || d=/
r=$(cd "$d" 2>/dev/null && pwd -P) || r="$d"
echo "@@path$T$r"
n=$(stat -c %d "$r" 2>/dev/null)
echo "@@dev$T$n"
echo "@@mountinfo"
head -c 1048576 /proc/self/mountinfo 2>/dev/null
echo; echo "@@df"
df -Pk "$r" 2>/dev/null | head -n 4
case "$n" in ''|*[!0-9]*) n=;; esac
if [ -n "$n" ]; then
  p=$(readlink -f "/sys/dev/block/$(( (n >> 8) & 4095 )):$(( (n & 255) | ((n >> 12) & 1048320) ))" 2>/dev/null)
  if [ -n "$p" ] && [ -d "$p" ]; then
    echo "@@block$T${p##*/}"
    k=0
    while [ "$k" -lt 8 ]; do
      if [ -e "$p/partition" ]; then p="${p%/*}"; fi
      s=$(ls "$p/slaves" 2>/dev/null | head -n 1)
      [ -n "$s" ] || break
      p=$(readlink -f "$p/slaves/$s" 2>/dev/null); k=$((k + 1))
    done
    echo "@@disk$T${p##*/}$T$p"
    for x in model vendor type; do echo "@@$x$T$(head -n 1 "$p/device/$x" 2>/dev/null)"; done
    echo "@@rotational$T$(head -n 1 "$p/queue/rotational" 2>/dev/null)"
  fi
fi
if [ -f "$f" ]; then
  e=$(dd if="$f" of=/dev/null bs=4096 count=1 iflag=direct 2>&1); c=$?
  echo "@@odirect$T$c"
  printf '%s\n' "$e" | head -n 4 | while IFS= read -r l; do echo "@@dd$T$l"; done
else
  echo "@@odirect${T}nofile"
fi
echo "@@end"
"""


@dataclass(frozen=True)
class Mount:
    majmin: str
    point: str
    options: str  # the mount's own, then its filesystem's (super options) not already there
    fs: str
    source: str


def _unescape(s: str) -> str:
    """A mountinfo path field: \\040 (space), \\011, \\012, \\134 are octal escapes."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo's lines (malformed ones skipped; at most MAX_MOUNTS)."""
    out = []
    for line in text.splitlines()[:MAX_MOUNTS]:
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 6 or len(b) < 2 or ":" not in a[2]:
            continue
        own = a[5].split(",")
        sup = [o for o in (b[2].split(",") if len(b) > 2 else []) if o not in own]
        out.append(Mount(a[2], _unescape(a[4]), ",".join(own + sup), b[0], _unescape(b[1])))
    return out


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, mounts: list[Mount], majmin: str | None = None) -> Mount | None:
    """The mount holding path: the longest mount point that is path or one of its parents; among mounts of that
    point the last (the one on top), preferring those of the path's own device number when it is known."""
    cands = [m for m in mounts if _under(path, m.point)]
    if majmin is not None and any(m.majmin == majmin for m in cands):
        cands = [m for m in cands if m.majmin == majmin]
    if not cands:
        return None
    longest = max(len(m.point) for m in cands)
    return [m for m in cands if len(m.point) == longest][-1]


def majmin_of(dev: int) -> str:
    """A device number (st_dev) as MAJ:MIN, Linux's encoding."""
    return f"{os.major(dev)}:{os.minor(dev)}"


def storage_kind(disk: str | None, sys_path: str, dev_type: str | None, fs: str | None) -> StorageKind:
    """The kind of a disk from its name, its sysfs path and its device type; with no disk, from the filesystem."""
    if disk is None:
        return "ram" if fs in ("tmpfs", "ramfs") else "unknown"
    low = sys_path.lower()
    if disk.startswith("mmcblk"):
        return "sd" if (dev_type or "").strip().upper() == "SD" else "emmc"
    if disk.startswith("nvme"):
        return "nvme"
    if disk.startswith("zram") or disk.startswith("ram"):
        return "ram"
    if disk.startswith("vd") or "/virtio" in low:
        return "virtio"
    if disk.startswith("sd"):
        if "ufs" in low:
            return "ufs"
        return "usb" if "/usb" in low else "scsi"
    return "unknown"


def parse_df(text: str) -> tuple[float | None, float | None]:
    """(free MiB, size MiB) from `df -Pk DIR` (header, then one line, which a long name may wrap)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return None, None
    f = " ".join(lines[1:]).split()
    if len(f) < 6 or not (f[1].isdigit() and f[3].isdigit()):
        return None, None
    return round(int(f[3]) / 1024, 1), round(int(f[1]) / 1024, 1)


def odirect_of(code: str | None, lines: list[str]) -> tuple[str, str]:
    """(yes | no | unknown, how) from the dd probe's exit code and its first lines."""
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    if code == "nofile":
        return "unknown", "the model file was not there to read"
    if code == "0":
        return "yes", "a 4 KiB read of the model with `dd iflag=direct` succeeded"
    if code is None or not code.isdigit():
        return "unknown", "the probe did not run"
    if code == "127":
        return "unknown", "no dd on the device"
    if any("invalid argument" in ln.lower() for ln in lines):
        return "no", f"`dd iflag=direct` on the model was refused: {first}"
    return "unknown", f"`dd iflag=direct` failed otherwise (exit {code}: {first or 'no message'}): this dd may lack it"


def parse_storage(text: str) -> Storage:
    """STORAGE_SCRIPT's output -> the Storage record (fields it lacks are None / unknown)."""
    text = text[:MAX_OUTPUT]
    one: dict[str, str] = {}
    mountinfo: list[str] = []
    df: list[str] = []
    dd: list[str] = []
    section = None
    for line in text.splitlines():
        if line.startswith("@@"):
            key, _, val = line[2:].partition("\t")
            if key == "dd":
                dd.append(val)
            elif key in ("mountinfo", "df", "end") and not val:
                section = key
            else:
                one.setdefault(key, val)
                section = None
        elif section == "mountinfo":
            mountinfo.append(line)
        elif section == "df":
            df.append(line)
    path = one.get("path") or "?"
    dev = one.get("dev", "").strip()
    majmin = majmin_of(int(dev)) if dev.isdigit() and int(dev) < 2**64 else None
    m = mount_of(path, parse_mountinfo("\n".join(mountinfo)), majmin)
    disk_name, _, sys_path = one.get("disk", "").partition("\t")
    disk = disk_name.strip() or None
    block = one.get("block", "").strip() or None
    rot = one.get("rotational", "").strip()
    free, size = parse_df("\n".join(df))
    od, how = odirect_of(one.get("odirect"), dd)
    fs = m.fs if m else None
    return Storage(path=path, kind=storage_kind(disk, sys_path, one.get("type"), fs), disk=disk,
                   block_device=block if block != disk else None, model=one.get("model"), vendor=one.get("vendor"),
                   rotational={"0": False, "1": True}.get(rot), fs=fs, mount_point=m.point if m else None,
                   mount_options=m.options if m else None, o_direct=od, o_direct_how=how, free_mib=free, size_mib=size)


# ---- this machine ----------------------------------------------------------------------------------------

def odirect_probe(path: str) -> tuple[str, str]:
    """(yes | no | unknown, how): the file opened with O_DIRECT and a page-aligned 4 KiB read at offset 0."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return "unknown", "this platform has no O_DIRECT"
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return "no", f"open(O_DIRECT) of the model was refused ({e.strerror})"
        return "unknown", f"cannot open the model ({e.strerror})"
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned
        try:
            os.preadv(fd, [buf], 0)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return "no", f"an aligned 4 KiB read with O_DIRECT was refused ({e.strerror})"
            return "unknown", f"the O_DIRECT read failed ({e.strerror})"
        finally:
            buf.close()
    finally:
        os.close(fd)
    return "yes", "open(O_DIRECT) and an aligned 4 KiB read of the model succeeded"


def read_local(model_path: str, timeout_s: float = 30.0) -> Storage:
    """This machine's storage under model_path: STORAGE_SCRIPT through sh, O_DIRECT tried by Python."""
    try:
        p = subprocess.run(["sh", "-c", STORAGE_SCRIPT, "sh", model_path], capture_output=True, timeout=timeout_s)
        out = p.stdout[:MAX_OUTPUT].decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    s = parse_storage(out)
    if not out:
        s.path = os.path.dirname(os.path.realpath(model_path)) or "/"
    od, how = odirect_probe(model_path) if os.path.isfile(model_path) else ("unknown", "the model file was not there")
    s.o_direct, s.o_direct_how = od, how  # type: ignore[assignment]
    return s
