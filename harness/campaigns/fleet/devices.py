"""A fleet campaign's devices and plan: which adb devices (the file's `targets:`, or every ready device of
`fleet.servers` that matches `fleet.match`), and the plan over them.

compare: every cell of the matrix once per device, device by device (the first device's cells are the
matrix itself; the others' vary `device` too, as an engines axis varies `engine`), each cell carrying its
device's label; every run then belongs to the device of its cell. spread: the matrix unchanged; any device
may take any run. The plan's `fleet` record lists the devices' labels in order, so a resumed folder has
the same devices (a selector that finds other devices makes another plan)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.campaigns.expand import Cell, order_runs
from harness.campaigns.validate import Plan
from harness.errors import UserError
from harness.formats.campaign_fleet import FleetRecord, parse_server, server_name
from harness.formats.campaign_replicate import planned_rounds


@dataclass(frozen=True)
class FleetDevice:
    label: str  # its name in the results: the file's label, else serial@host:port
    serial: str
    host: str
    port: int

    @property
    def server(self) -> str:
        return server_name(self.host, self.port)


def use_of(plan: Plan) -> str:
    f = plan.campaign.fleet
    return f.use if f is not None else "compare"


def listed_devices(plan: Plan) -> list[FleetDevice]:
    """The devices the file's `targets:` lists, in its order."""
    return [FleetDevice(t.name(), t.serial, *parse_server(t.server)) for t in plan.campaign.targets or []]


def matches(desc: dict, model: str | None, min_ram_gib: float | None) -> bool:
    """A described device (harness.devices.adb.Device.describe) against a selector's match."""
    if model is not None and desc.get("model") != model:
        return False
    mem = desc.get("mem_total_mib")
    return min_ram_gib is None or isinstance(mem, int | float) and mem / 1024 >= min_ram_gib


def selected_devices(plan: Plan) -> tuple[list[FleetDevice], dict[str, dict], list[str]]:
    """A selector's devices: every ready device of fleet.servers that matches (sorted by server, then
    serial), their descriptions by label, and one line per server that does not answer."""
    from harness.devices.listing import fleet_listing

    f = plan.campaign.fleet
    assert f is not None and f.servers is not None
    found, down = fleet_listing([parse_server(s) for s in f.servers])
    want = f.match
    out, descs = [], {}
    for d in found:
        if d["state"] != "device" or "error" in d:
            continue
        if want is not None and not matches(d, want.model, want.min_ram_gib):
            continue
        host, port = parse_server(d["server"])
        dev = FleetDevice(f"{d['serial']}@{d['server']}", d["serial"], host, port)
        out.append(dev)
        descs[dev.label] = d
    if not out:
        why = "; ".join(down) or "no ready device matches"
        raise UserError(f"{plan.campaign.source}: fleet.servers: no device to run on ({why}); `bmoe-bench devices "
                        + " ".join(f"--server {s}" for s in f.servers) + "` lists what each server sees")
    return out, descs, down


def fleet_plan(plan: Plan, devices: list[FleetDevice]) -> Plan:
    """The plan over these devices (compare: the matrix once per device; spread: unchanged), with its
    fleet record."""
    c = plan.campaign
    use = use_of(plan)
    f = c.fleet
    every = lambda x: type(x).model_validate(x.model_dump())  # noqa: E731 (every field set: the hash names each)
    rec = FleetRecord(use=use, devices=[d.label for d in devices],
                      **({"targets": [every(t) for t in c.targets]} if c.targets is not None else {}),
                      **({"servers": list(f.servers)} if f is not None and f.servers is not None else {}),
                      **({"match": every(f.match)} if f is not None and f.match is not None else {}))
    if use == "spread":
        return replace(plan, fleet=rec)
    cells = device_cells(plan.cells, [d.label for d in devices])
    return replace(plan, cells=cells, runs=order_runs(len(cells), planned_rounds(c), c.order, c.seed), fleet=rec)


def device_cells(matrix: list[Cell], labels: list[str]) -> list[Cell]:
    """Every cell once per device, device by device: the same flags and engine, its device's label; a cell of
    another device than the first varies `device` too (its ratio to the base is then the device's)."""
    out: list[Cell] = []
    for k, label in enumerate(labels):
        shift = k * len(matrix)
        for s in matrix:
            varied = {**s.varied, **({"device": label} if k else {})}
            out.append(Cell(index=shift + s.index, flags=s.flags, varied=varied, line=s.line, name=f"{label} {s.label}",
                            engine=s.engine, setting=s.setting + shift if s.setting >= 0 else -1, device=label))
    return out


def owner_of(plan: Plan) -> dict[int, str] | None:
    """compare: cell index -> the label of the device its runs belong to; spread: None (any device)."""
    if plan.fleet is None or plan.fleet.use == "spread":
        return None
    return {x.index: x.device for x in plan.cells}
