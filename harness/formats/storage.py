"""The storage a campaign's model was read from, per device (the manifest's `provenance.storage` on one target,
`provenance.devices.<label>.storage` on several): the block device under the model's directory (partitions and
device-mapper resolved to the disk), its kind, model and vendor, the filesystem and its mount options, whether
O_DIRECT took effect there, and the free space, all read once when the campaign opened the device.

Every text field is read from a device, so it is bounded and printable here; a value that could not be read
is None (or `unknown`), never a guess."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from harness.formats.record import Record

# ufs, emmc, sd (an SD card), nvme, scsi (a SATA or SAS disk), usb, virtio (a VM's disk): a block device; ram: tmpfs
# or ramfs (no storage below it); unknown: the filesystem has no block device this could find (FUSE, overlay, NFS,
# btrfs's anonymous device) or the disk is of no kind named here
StorageKind = Literal["ufs", "emmc", "sd", "nvme", "scsi", "usb", "virtio", "ram", "unknown"]
ODirect = Literal["yes", "no", "unknown"]
_NAMES = {"ufs": "UFS", "emmc": "eMMC", "sd": "SD card", "nvme": "NVMe", "scsi": "SCSI disk", "usb": "USB disk",
          "virtio": "virtio disk", "ram": "RAM (no storage device)", "unknown": "unknown storage"}
MAX_TEXT = 300  # characters of one field read from a device (a mount's options are the longest)


def bounded(v: str | None) -> str | None:
    """v without control characters, cut to MAX_TEXT; None when empty."""
    if v is None:
        return None
    s = "".join(ch for ch in str(v) if ch.isprintable()).strip()[:MAX_TEXT]
    return s or None


class Storage(Record):
    """Where one device read the model from."""

    path: str  # the model's directory as the device resolves it (links followed)
    kind: StorageKind
    disk: str | None = None  # the whole block device: sda, mmcblk0, nvme0n1, vda (None: no block device found)
    block_device: str | None = None  # the one the filesystem is on, when not the disk: sda5, dm-3
    model: str | None = None  # /sys/block/<disk>/device/model
    vendor: str | None = None  # /sys/block/<disk>/device/vendor
    rotational: bool | None = None  # /sys/block/<disk>/queue/rotational
    fs: str | None = None  # the filesystem type of the mount holding the path (mountinfo)
    mount_point: str | None = None
    mount_options: str | None = None  # the mount's own options, then its filesystem's (mountinfo)
    o_direct: ODirect = "unknown"  # a read of the model with O_DIRECT succeeded (yes) or was refused (no)
    o_direct_how: str = ""  # how that was found, and why unknown
    free_mib: float | None = None  # free to an unprivileged user (df / statvfs)
    size_mib: float | None = None  # the filesystem's size

    _text = field_validator("path", "disk", "block_device", "model", "vendor", "fs", "mount_point", "mount_options",
                            "o_direct_how", mode="before")(lambda v: bounded(v) if v is not None else None)

    @field_validator("free_mib", "size_mib")
    @classmethod
    def _mib(cls, v: float | None) -> float | None:
        if v is not None and not 0 <= v < 2**40:
            raise ValueError(f"{v} MiB is not a size")
        return v

    def summary(self) -> str:
        """One line for findings: what the storage is and what it allowed."""
        what = _NAMES[self.kind]
        disk = " ".join(x for x in (self.vendor, self.model) if x)
        dev = f" `{self.disk}`" + (f" ({disk})" if disk else "") if self.disk else ""
        via = f" via `{self.block_device}`" if self.block_device else ""
        fs = f"{self.fs or 'unknown filesystem'} on `{self.mount_point or '?'}`"
        opts = f" ({self.mount_options})" if self.mount_options else ""
        free = f"; {self.free_mib / 1024:.1f} GiB free" if self.free_mib is not None else ""
        return (f"{what}{dev}{via}, {fs}{opts}; O_DIRECT {self.o_direct}"
                + (f" ({self.o_direct_how})" if self.o_direct_how else "") + free)
