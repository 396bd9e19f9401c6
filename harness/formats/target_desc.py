"""The manifest's description of the target a campaign ran on (`target`, harness.formats.manifest), as the
target describes itself: a local machine, an adb device or an SSH machine, each with the keys it knows."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from harness.formats.record import Record


class CgroupDesc(Record):
    version: int
    parent: str


class LocalTargetDesc(Record):
    kind: Literal["local"]
    hostname: str | None = None
    kernel: str | None = None
    machine: str | None = None
    cpu_model: str | None = None
    cpus: int | None = None
    mem_total_mib: float | None = None
    python: str | None = None
    mem_cap_mib: int | None = None
    cgroup: CgroupDesc | None = None
    drop_caches: bool | None = None


class AdbTargetDesc(Record):
    kind: Literal["adb"]
    serial: str | None = None
    manufacturer: str | None = None
    model: str | None = None
    device: str | None = None
    platform: str | None = None
    android_release: str | None = None
    sdk: str | None = None
    abi: str | None = None
    kernel: str | None = None
    hardware: str | None = None
    cpus: int | None = None
    mem_total_mib: float | None = None
    device_dir: str | None = None
    device_dir_free_mib: int | None = None
    fingerprint: str | None = None  # ro.build.fingerprint
    server: str | None = None  # the adb server it was reached through, host:port


class SshTargetDesc(Record):
    """A machine over SSH (an ARM board, or a phone's Termux: then `via` names the adb forward and the Android
    fields are what getprop answered)."""

    kind: Literal["ssh"]
    host: str | None = None
    port: int | None = None
    user: str | None = None
    via: str | None = None
    kernel: str | None = None
    hardware: str | None = None
    cpus: int | None = None
    mem_total_mib: float | None = None
    model: str | None = None
    android_release: str | None = None
    platform: str | None = None
    abi: str | None = None
    dir: str | None = None
    dir_free_mib: int | None = None


TargetDesc = Annotated[LocalTargetDesc | AdbTargetDesc | SshTargetDesc, Field(discriminator="kind")]
