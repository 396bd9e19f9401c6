"""The storage under a model (harness.devices.storage): the parser on fixture text of a phone (UFS under
device-mapper), an eMMC board, an NVMe laptop and a tmpfs, then the script on this machine's real filesystems:
the disk and filesystem findmnt names, and O_DIRECT as dd finds it, on a tmpfs and on a ramfs (which refuses
O_DIRECT) mounted in a mount namespace of the test's own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.devices.storage import (
    STORAGE_SCRIPT,
    mount_of,
    odirect_of,
    parse_mountinfo,
    parse_storage,
    read_local,
    storage_kind,
)
from harness.formats.storage import MAX_TEXT, Storage

PHONE = """@@path\t/data/local/tmp/bmoe
@@dev\t64774
@@mountinfo
1 0 253:3 / / ro,relatime shared:1 - ext4 /dev/block/dm-3 ro,seclabel
40 1 0:21 / /dev rw,nosuid,relatime shared:2 - tmpfs tmpfs rw,seclabel,size=5855776k,mode=755
45 1 253:6 / /data rw,nosuid,nodev,noatime shared:30 - f2fs /dev/block/dm-6 rw,lazytime,seclabel,background_gc=on
46 45 0:40 / /data/local/tmp/other rw - tmpfs tmpfs rw
@@df
Filesystem      1K-blocks     Used Available Use% Mounted on
/dev/block/dm-6 236571260 40000000 196571260  17% /data
@@block\tdm-6
@@disk\tsda\t/sys/devices/platform/13200000.ufs/host0/target0:0:0/0:0:0:0/block/sda
@@model\tKLUEG8UHDC-B0E1
@@vendor\tSAMSUNG
@@type\t0
@@rotational\t0
@@odirect\t0
@@dd\t1+0 records in
@@dd\t1+0 records out
@@end
"""


def test_a_phone_with_ufs_under_device_mapper():
    s = parse_storage(PHONE)
    assert s == Storage(path="/data/local/tmp/bmoe", kind="ufs", disk="sda", block_device="dm-6",
                        model="KLUEG8UHDC-B0E1", vendor="SAMSUNG", rotational=False, fs="f2fs", mount_point="/data",
                        mount_options="rw,nosuid,nodev,noatime,lazytime,seclabel,background_gc=on", o_direct="yes",
                        o_direct_how="a 4 KiB read of the model with `dd iflag=direct` succeeded",
                        free_mib=191964.1, size_mib=231026.6)
    line = s.summary()
    assert line.startswith("UFS `sda` (SAMSUNG KLUEG8UHDC-B0E1) via `dm-6`, f2fs on `/data`") and "O_DIRECT yes" in line


def test_emmc_nvme_sd_and_a_tmpfs():
    emmc = PHONE.replace("@@block\tdm-6", "@@block\tmmcblk0p40").replace(
        "sda\t/sys/devices/platform/13200000.ufs/host0/target0:0:0/0:0:0:0/block/sda",
        "mmcblk0\t/sys/devices/platform/soc/7824900.sdhci/mmc_host/mmc0/mmc0:0001/block/mmcblk0").replace(
        "@@type\t0", "@@type\tMMC")
    s = parse_storage(emmc)
    assert (s.kind, s.disk, s.block_device) == ("emmc", "mmcblk0", "mmcblk0p40")
    assert storage_kind("mmcblk1", "/sys/devices/.../mmc1/block/mmcblk1", "SD", "vfat") == "sd"
    assert storage_kind("nvme0n1", "/sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1", None,
                        "ext4") == "nvme"
    assert storage_kind("sda", "/sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda", "0",
                        "ext4") == "scsi"
    assert storage_kind("sdb", "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/block/sdb", "0",
                        "exfat") == "usb"
    assert storage_kind("vda", "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda", None, "ext4") == "virtio"
    tmp = "@@path\t/data/local/tmp\n@@dev\t40\n@@mountinfo\n9 1 0:40 / /data rw - tmpfs tmpfs rw,size=131072k\n" \
          "@@df\n@@odirect\t0\n@@end\n"
    s = parse_storage(tmp)
    assert (s.kind, s.disk, s.fs, s.mount_point, s.free_mib) == ("ram", None, "tmpfs", "/data", None)
    assert "RAM (no storage device)" in s.summary()


def test_mountinfo_escapes_and_the_mount_on_top():
    text = ("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
            "2 1 0:30 / /mnt/my\\040disk rw - tmpfs tmpfs rw\n"
            "3 1 8:2 / /mnt/my\\040disk rw,noatime - ext4 /dev/sda2 rw,errors=remount-ro\n"
            "garbage line\n")
    ms = parse_mountinfo(text)
    assert [m.point for m in ms] == ["/", "/mnt/my disk", "/mnt/my disk"]
    assert mount_of("/mnt/my disk/models", ms).source == "/dev/sda2"  # mounted last: on top
    assert mount_of("/mnt/my disk/models", ms, "0:30").fs == "tmpfs"  # the path's own device number decides
    assert mount_of("/mnt/my diskette", ms).point == "/"  # a prefix of the name is not a parent
    assert mount_of("/x", []) is None


def test_odirect_answers():
    assert odirect_of("0", [])[0] == "yes"
    no = odirect_of("1", ["dd: failed to open '/data/m.gguf': Invalid argument"])
    assert no == ("no", "`dd iflag=direct` on the model was refused: dd: failed to open '/data/m.gguf': Invalid "
                        "argument")
    old = odirect_of("1", ["dd: bad iflag direct"])  # a toybox dd from before iflag=direct
    assert old[0] == "unknown" and "this dd may lack it" in old[1]
    assert odirect_of("127", ["sh: dd: not found"]) == ("unknown", "no dd on the device")
    assert odirect_of("nofile", [])[0] == "unknown"
    assert odirect_of(None, [])[0] == "unknown"


def test_what_a_device_says_is_bounded():
    evil = PHONE.replace("KLUEG8UHDC-B0E1", "X" * 5000 + "\x1b[2J").replace("@@dev\t64774", "@@dev\t" + "9" * 400)
    s = parse_storage(evil + "junk\n" * 10)
    assert len(s.model) == MAX_TEXT and "\x1b" not in s.model
    assert s.mount_point == "/data"  # an absurd device number is ignored, the longest mount point decides
    with pytest.raises(ValidationError):
        Storage(path="/x", kind="ufs", free_mib=-1.0)
    with pytest.raises(ValidationError):
        Storage(path="/x", kind="floppy")


# ---- this machine ----------------------------------------------------------------------------------------

def findmnt(path: Path) -> tuple[str, str, str]:
    out = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE,TARGET", "--target", str(path)], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], out[1], out[2]


def dd_direct(path: Path) -> str:
    p = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4096", "count=1", "iflag=direct"], capture_output=True,
                       text=True)
    return "yes" if p.returncode == 0 else "no" if "Invalid argument" in p.stderr else "unknown"


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="needs findmnt (util-linux)")
def test_this_machines_disk(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(16384))
    s = read_local(str(model))
    source, fs, target = findmnt(tmp_path)
    assert (s.path, s.fs, s.mount_point) == (str(tmp_path.resolve()), fs, target)
    if source.startswith("/dev/") and s.disk is not None:  # a partition or dm device names its disk's sysfs entry
        name = Path(os.path.realpath(source)).name
        assert name in (s.disk, s.block_device)
    assert s.o_direct == dd_direct(model) and s.o_direct_how.startswith(("open(O_DIRECT)", "an aligned"))
    st = os.statvfs(tmp_path)
    assert s.free_mib == pytest.approx(st.f_bavail * st.f_frsize / 2**20, rel=0.05, abs=64)


_IN_NS = r"""
set -e
mount -t "$1" none "$2"
head -c 16384 /dev/urandom > "$2/m.gguf"
exec "$3" -c 'import sys
from harness.devices.storage import read_local as r; print(r(sys.argv[1]).model_dump_json())' \
  "$2/m.gguf"
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounts a ramfs and a tmpfs in a mount namespace of its own: needs root")
@pytest.mark.parametrize("fs", ["ramfs", "tmpfs"])
def test_ram_filesystems_and_o_direct_refused_on_ramfs(tmp_path, fs):
    where = tmp_path / fs
    where.mkdir()
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _IN_NS, "sh", fs, str(where),
                        sys.executable], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert p.returncode == 0, p.stderr
    s = Storage.model_validate_json(p.stdout)
    assert (s.kind, s.fs, s.mount_point, s.disk) == ("ram", fs, str(where), None)
    if fs == "ramfs":
        assert s.o_direct == "no" and "Invalid argument" in s.o_direct_how  # ramfs has no direct I/O at all
    else:
        assert s.o_direct in ("yes", "no")  # tmpfs took O_DIRECT from Linux 6.6 on: the kernel's answer is recorded


def test_the_script_on_this_machine_agrees_with_the_python_probe(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(8192))
    out = subprocess.run(["sh", "-c", STORAGE_SCRIPT, "sh", str(model)], capture_output=True, text=True).stdout
    by_dd = parse_storage(out)
    by_py = read_local(str(model))
    assert by_dd.o_direct == by_py.o_direct != "unknown"
    assert by_dd.model_dump(exclude={"o_direct_how", "free_mib"}) == by_py.model_dump(exclude={"o_direct_how",
                                                                                                 "free_mib"})
