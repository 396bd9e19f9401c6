"""What `bmoe-bench devices` lists: the devices of one adb server (`device_summaries`, the local one by
default), or of every server named with `--server H:P` (`fleet_listing`): each device with its state and,
when ready, model, SoC, RAM, Android version and build fingerprint, asked of all devices at once. A
server that does not answer is one line naming it (harness.devices.adb_client: never replaced by a local one)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from harness.devices.adb import ADB_ERRORS, Device, DeviceGone
from harness.devices.adb_client import ServerClient, ServerUnreachable, list_server, server_name
from harness.devices.parse import one_line
from harness.errors import UserError


def device_summaries(host: str = "127.0.0.1", port: int = 5037, details: bool = False) -> list[dict]:
    """[{serial, state, and with details for ready devices: model, android_release, free_mib}]."""
    try:
        infos = ServerClient(host=host, port=port).list()
    except ADB_ERRORS as e:
        raise UserError(f"adb is not usable (server {host}:{port}): {one_line(e)}") from e
    out = []
    for info in infos:
        d: dict = {"serial": info.serial, "state": info.state}
        if details and info.state == "device":
            try:
                dev = Device(info.serial, host=host, port=port)
                desc = dev.describe()
                d["model"] = " ".join(x for x in (desc["manufacturer"], desc["model"]) if x) or None
                d["android_release"] = desc["android_release"]
                d["kernel"] = desc["kernel"]
                free = dev.free_kib("/data/local/tmp")
                d["free_mib"] = round(free / 1024) if free is not None else None
            except (UserError, DeviceGone) as e:
                d["error"] = str(e)
        out.append(d)
    return out


def describe_device(serial: str, host: str, port: int) -> dict:
    """Device.describe() of one ready device, or {"error": why} when it cannot be asked."""
    try:
        return Device(serial, host=host, port=port).describe()
    except (UserError, DeviceGone) as e:
        return {"error": str(e)}


def fleet_listing(servers: list[tuple[str, int]]) -> tuple[list[dict], list[str]]:
    """Every device of every server ({serial, server, state, and describe()'s keys when ready}), and one
    line per server that does not answer. Servers and devices are asked concurrently."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(servers)))) as pool:
        listed = list(pool.map(_list_one, servers))
    devices: list[dict] = []
    down: list[str] = []
    for (host, port), got in zip(servers, listed, strict=True):
        if isinstance(got, str):
            down.append(got)
            continue
        devices += [{"serial": d.serial, "server": server_name(host, port), "state": d.state, "_at": (host, port)}
                    for d in got]
    ready = [d for d in devices if d["state"] == "device"]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(ready)))) as pool:
        descs = list(pool.map(lambda d: describe_device(d["serial"], *d["_at"]), ready))
    for d, desc in zip(ready, descs, strict=True):
        d.update({k: v for k, v in desc.items() if k not in ("serial", "server", "kind")})
    for d in devices:
        del d["_at"]
    return devices, down


def _list_one(server: tuple[str, int]):
    try:
        return list_server(*server)
    except ServerUnreachable as e:
        return str(e)


def format_fleet(devices: list[dict]) -> list[str]:
    """One line per device: serial@server, state, model, SoC, RAM, Android version (or kernel), fingerprint."""
    lines = []
    for d in devices:
        cols = [f"{d['serial']}@{d['server']}", d["state"]]
        if "error" in d:
            cols.append(f"error: {d['error']}")
        elif d["state"] == "device":
            mem = d.get("mem_total_mib")
            cols += [" ".join(x for x in (d.get("manufacturer"), d.get("model")) if x) or "(no getprop)",
                     f"SoC {d.get('platform') or '-'}",
                     f"RAM {mem / 1024:.1f} GiB" if isinstance(mem, int | float) else "RAM -",
                     f"Android {d['android_release']}" if d.get("android_release") else (d.get("kernel") or "-"),
                     d.get("fingerprint") or "(no fingerprint)"]
        lines.append("\t".join(cols))
    return lines
