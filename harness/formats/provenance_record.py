"""The provenance records of a campaign manifest (`bmoe-manifest` v3's `provenance`): which engine build ran, on
which device, reading the model from which storage. harness.formats.manifest re-exports each name."""

from __future__ import annotations

from typing import Literal

from harness.formats.hub_source import HubSource
from harness.formats.record import Record
from harness.formats.storage import Storage


class EngineIdentity(Record):
    """Which build of an engine ran (v3)."""

    version: str  # the first line of `ENGINE --version`
    sha256: str | None = None  # external: the executable's sha256, hashed on the target
    llama_cpp: str | None = None  # bmoe: the llama.cpp commit its pinned llama-cpp-python vendors
    commit: str | None = None  # bmoe: the git commit of the tree its code was loaded from
    dirty: bool | None = None  # bmoe: that tree had uncommitted changes (a warning in the findings)


class DeviceFingerprint(Record):
    """What the device is, as far as a result depends on it (v3). adb: the build fingerprint, SoC, RAM and
    Android version; local and ssh: the CPU model and kernel (ssh on Termux: Android's SoC and version too)."""

    kind: Literal["local", "adb", "ssh"]
    fingerprint: str | None = None  # adb: ro.build.fingerprint
    soc: str | None = None  # adb: ro.soc.model, else ro.board.platform
    android: str | None = None  # adb: ro.build.version.release
    cpu_model: str | None = None
    kernel: str | None = None
    mem_total_mib: float | None = None


class DeviceProvenance(Record):
    """One device of a campaign on several: what it is and where it read the model from."""

    fingerprint: DeviceFingerprint
    storage: Storage | None = None


class Provenance(Record):
    model_sha256: dict[str, str]  # model file name -> sha256 (every shard of a split model), on the target
    engines: dict[str, EngineIdentity]  # by engine label (the engines axis), or the engine's kind
    device: DeviceFingerprint  # on several devices: the first one opened
    hub: HubSource | None = None  # model: {hf: ...}: the repo, commit and files pulled
    storage: Storage | None = None  # where `device` read the model from (absent in a folder from before it)
    devices: dict[str, DeviceProvenance] | None = None  # runs on several devices: each one's, by label (likewise)
