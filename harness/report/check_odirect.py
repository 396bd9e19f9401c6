"""`bmoe-bench check`: does what each streamed run's engine says of O_DIRECT agree with what the storage probe
found on the device it ran on? Pure: the loaded folder in, lines out.

Two readings of the same fact are recorded. The engine writes `odirect_effective` (0 or 1) into its metrics CSV's
preamble when it streams, beside `cfg.odirect` (what the run asked for). The campaign's storage probe
(harness.devices.storage, recorded in provenance) read 4 KiB of the model with O_DIRECT when it opened the device:
`o_direct` yes, no or unknown. They must agree:

- the engine says O_DIRECT took effect where the probe found it refused: a problem (one of the two is wrong);
- a run asked for O_DIRECT, the probe found it works, and the engine ran buffered: a problem (the cell is labelled
  O_DIRECT but measured buffered reads);
- a run asked for O_DIRECT and ran buffered where the probe found it refused or could not tell: a note (the
  engine's documented fallback; its reads went through the page cache).

A run without these keys (the C++ peer, a resident run, a folder from before the probe) is not judged."""

from __future__ import annotations

from harness.formats.storage import Storage
from harness.report.collect import CampaignData


def _storage_of(data: CampaignData, device: str | None) -> Storage | None:
    pv = data.manifest.provenance
    if pv is None:
        return None
    if device is not None and pv.devices is not None:
        rec = pv.devices.get(device)
        return rec.storage if rec is not None else None
    return pv.storage


def _flag(v: str | None) -> bool | None:
    return {"1": True, "True": True, "true": True, "0": False, "False": False, "false": False}.get(v or "")


def check_odirect(data: CampaignData) -> tuple[list[str], list[str]]:
    """(problems, notes): each ok streamed run's odirect_effective against its device's storage probe."""
    problems: list[str] = []
    buffered: dict[str, list[str]] = {}
    for r in data.runs:
        if not r.ok or r.metrics is None:
            continue
        asked, took = _flag(r.metrics.meta.get("cfg.odirect")), _flag(r.metrics.meta.get("odirect_effective"))
        st = _storage_of(data, r.rec.device)
        if took is None or st is None:
            continue
        where = f"device {r.rec.device}" if r.rec.device else "the device"
        if took and st.o_direct == "no":
            problems.append(f"run {r.run_id}: the engine says O_DIRECT took effect, but the storage probe found it "
                            f"refused on {where} ({st.o_direct_how}): one of the two is wrong")
        elif asked and not took and st.o_direct == "yes":
            problems.append(f"run {r.run_id}: it asked for O_DIRECT and the engine read buffered, though the storage "
                            f"probe found O_DIRECT works on {where}: its cell measured buffered reads")
        elif asked and not took:
            buffered.setdefault(f"{where} (storage probe: O_DIRECT {st.o_direct})", []).append(r.run_id)
    notes = [f"run(s) {' '.join(ids)} asked for O_DIRECT and the engine read buffered (through the page cache) on "
             f"{where}" for where, ids in buffered.items()]
    return problems, notes
