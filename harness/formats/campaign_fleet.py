"""A campaign over a fleet of adb devices (campaign keys `targets:` and `fleet:`), declared once here.

    targets:                      # the devices, each through the adb server it is attached to
      - {serial: R5CT1234, server: lab1:5037, label: s23-a}
      - {serial: 0A1B2C3D, server: lab2:5037}          # label: 0A1B2C3D@lab2:5037
    fleet: {use: compare, device_grace_s: 300}

or, instead of `targets:`, a selector that takes every ready device of some servers that matches:

    fleet: {use: spread, servers: [lab1:5037, lab2:5037], match: {model: SM-S911B, min_ram_gib: 7}}

`use: compare` makes the device an axis: the whole matrix runs on each device. `use: spread` shares the
runs of one matrix among devices of one kind to finish sooner. `device_grace_s`: how long a device that
went away (or a server that stopped answering) is waited for before its remaining runs go to the other
devices (spread) or are reported as not run (compare)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from harness.formats.campaign_types import Label
from harness.formats.record import Record

DEFAULT_SERVER = "127.0.0.1:5037"
MAX_TARGETS = 1000  # devices a campaign names (each is a connection and a column of its own)
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


def parse_server(text: str) -> tuple[str, int]:
    """An adb server's `host:port` -> (host, port); ValueError saying what is wrong. IPv6: [::1]:5037."""
    m = _HOST_PORT.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not host:port (an adb server, e.g. 127.0.0.1:5037 or lab1:5037)")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise ValueError(f"{text!r}: port {port} is not 1-65535")
    return m["host"].strip("[]"), port


def server_name(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _server(v: str) -> str:
    try:
        parse_server(v)
    except ValueError as e:
        raise PydanticCustomError("campaign", str(e).replace("{", "{{").replace("}", "}}")) from None
    return v


Server = Annotated[str, AfterValidator(_server)]


class _Model(BaseModel):  # as the campaign file's parts: strict, frozen, no unknown keys
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FleetTarget(_Model):
    serial: str = Field(min_length=1, description="the device's adb serial, as its server lists it")
    server: Server = Field(DEFAULT_SERVER, description="the adb server it is attached to, host:port")
    label: Label | None = Field(None, description="its name in the results (default serial@host:port)")

    def name(self) -> str:
        return self.label or f"{self.serial}@{self.server}"


class FleetMatch(_Model):
    model: str | None = Field(None, description="ro.product.model must equal this")
    min_ram_gib: float | None = Field(None, gt=0, description="at least this much RAM (MemTotal)")


class FleetSpec(_Model):
    use: Literal["compare", "spread"] = Field("compare", description=(
        "compare: the device is an axis, the whole matrix on each; spread: devices of one kind share the runs"))
    servers: list[Server] | None = Field(None, min_length=1, description=(
        "instead of targets: every ready device of these adb servers (host:port) that matches"))
    match: FleetMatch | None = Field(None, description="with servers: which devices, {model, min_ram_gib}")
    device_grace_s: float = Field(300.0, ge=0, description=(
        "how long a device or server that went away is waited for before its runs are given up"))


class FleetRecord(Record):  # in the manifest's plan record
    """A fleet campaign's devices (set only then): its use, the devices as asked, and their labels in order
    (compare: the values of the cells' `device` axis, the first the reference)."""

    use: Literal["compare", "spread"]
    devices: list[str]
    targets: list[FleetTarget] | None = None  # as listed in the file
    servers: list[str] | None = None  # or the selector's servers and match
    match: FleetMatch | None = None


def fleet_problems(c) -> list[tuple[tuple, str]]:
    """The rules between the fleet keys and the rest of a CampaignFile, as (location, message)."""
    f, ts = c.fleet, c.targets
    if f is None and ts is None:
        return []
    out: list[tuple[tuple, str]] = []
    if f is not None and f.servers is not None and ts is not None:
        out.append((("fleet", "servers"), "give either targets (a list of devices) or fleet.servers (a selector), "
                                          "not both"))
    if ts is None and (f is None or f.servers is None):
        out.append((("fleet",), "a fleet needs its devices: targets: [{serial, server}] or fleet.servers"))
    if f is not None and f.match is not None and f.servers is None:
        out.append((("fleet", "match"), "fleet.match selects among fleet.servers' devices; add servers"))
    if ts is not None and len(ts) > MAX_TARGETS:
        return [*out, (("targets",), f"targets: {len(ts)} devices, more than the {MAX_TARGETS} one campaign may name; "
                                     "split them over several campaigns (bmoe-bench merge joins their folders)")]
    names: set[str] = set()
    seen: set[tuple[str, tuple[str, int]]] = set()
    for i, t in enumerate(ts or []):  # sets, not earlier slices: 30,000 targets took 38 s to validate
        device, twice = (t.serial, parse_server(t.server)), t.name() in names
        if twice:
            out.append((("targets", i), f"targets: {t.name()} is listed twice (labels must differ)"))
        elif device in seen:
            out.append((("targets", i), f"targets: {t.serial} at {t.server} is listed twice"))
        names.add(t.name())
        seen.add(device)
    t = c.target
    if t.kind != "adb":
        out.append((("target",), "a fleet runs on adb devices: remove target, or make it {kind: adb}"))
    if t.serial is not None:
        out.append((("target", "serial"), "target.serial names one device; a fleet names its devices in targets"))
    for key in ("precision", "fidelity"):
        if getattr(c, key) is not None:
            out.append(((key,), f"{key} is not supported on a fleet yet; run it on one device (target:)"))
    return out
