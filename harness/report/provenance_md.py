"""The provenance lines of findings.md's Setup and its warnings (pure: the manifest in, markdown out)."""

from __future__ import annotations

from harness.formats.manifest import Manifest


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
    d = pv.device
    if d.kind == "adb":
        dev = (f"fingerprint `{d.fingerprint}`, SoC {d.soc}, Android {d.android}, "
               f"{(d.mem_total_mib or 0) / 1024:.1f} GiB RAM, kernel {d.kernel}")
    else:
        dev = f"{d.cpu_model}, kernel {d.kernel}, {(d.mem_total_mib or 0) / 1024:.1f} GiB RAM"
    out.append(f"- **Device**: {dev}.")
    return out


def provenance_warnings(m: Manifest) -> list[str]:
    """Lines for the findings' warnings: an engine built from a tree with uncommitted changes."""
    pv = m.provenance
    if pv is None:
        return []
    return [f"dirty tree: engine {k} ran from a source tree with uncommitted changes (commit "
            f"{(e.commit or '?')[:12]}): the exact code is not recoverable" for k, e in pv.engines.items() if e.dirty]
