"""The provenance lines of findings.md's Setup and its warnings (pure: the manifest in, markdown out)."""

from __future__ import annotations

from harness.formats.manifest import DeviceFingerprint, Manifest


def provenance_lines(m: Manifest) -> list[str]:
    pv = m.provenance
    if pv is None:
        return ["- **Provenance**: not recorded (a folder from before manifest v3): the model file's sha256, the "
                "engine build and the device fingerprint are unknown."]
    model = ", ".join(f"`{k}` sha256 `{v}`" for k, v in sorted(pv.model_sha256.items()))
    out = [f"- **Model file**: {model} (hashed on the target; every run checked against it)."]
    for k, e in pv.engines.items():
        parts = [f"`{e.version}`"]
        if e.sha256:
            parts.append(f"binary sha256 `{e.sha256}`")
        if e.llama_cpp:
            parts.append(f"llama.cpp `{e.llama_cpp}`")
        if e.llama_cpp or e.commit:
            parts.append(f"source commit `{(e.commit or 'unknown')[:12]}`"
                         + (" **with uncommitted changes**" if e.dirty else ""))
        out.append(f"- **Engine build** ({k}): " + ", ".join(parts) + ".")
    if pv.devices:
        out.append("- **Devices** (each one's fingerprint, and the storage it read the model from):")
        for label, dp in pv.devices.items():
            out.append(f"  - **{label}**: {_device(dp.fingerprint)}.")
            out.append(f"    Storage: {dp.storage.summary() if dp.storage else 'not recorded'}.")
        return out
    out.append(f"- **Device**: {_device(pv.device)}.")
    if pv.storage is not None:
        out.append(f"- **Storage** of the model: {pv.storage.summary()}.")
    return out


def _device(d: DeviceFingerprint) -> str:
    if d.kind == "adb":
        return (f"fingerprint `{d.fingerprint}`, SoC {d.soc}, Android {d.android}, "
                f"{(d.mem_total_mib or 0) / 1024:.1f} GiB RAM, kernel {d.kernel}")
    return f"{d.cpu_model}, kernel {d.kernel}, {(d.mem_total_mib or 0) / 1024:.1f} GiB RAM"


def provenance_warnings(m: Manifest) -> list[str]:
    """Lines for the findings' warnings: an engine built from a tree with uncommitted changes; the model's storage
    refusing O_DIRECT, or being RAM (tmpfs), on a device."""
    pv = m.provenance
    if pv is None:
        return []
    out = [f"dirty tree: engine {k} ran from a source tree with uncommitted changes (commit "
           f"{(e.commit or '?')[:12]}): the exact code is not recoverable" for k, e in pv.engines.items() if e.dirty]
    stores = {k: d.storage for k, d in pv.devices.items()} if pv.devices else {"": pv.storage}
    for k, st in stores.items():
        on = f" on {k}" if k else ""
        if st is not None and st.o_direct == "no":
            out.append(f"storage: O_DIRECT is refused where the model is{on} ({st.fs or 'unknown filesystem'}, "
                       f"`{st.path}`): an engine asked for it reads through the page cache there")
        if st is not None and st.kind == "ram":
            out.append(f"storage: the model is in RAM{on} ({st.fs}, `{st.path}`): its reads measure no storage device")
    return out
