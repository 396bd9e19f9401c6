"""Wheels of the harness's own installed distributions, for a deploy to a target that can run the harness's
binaries (same machine type, Python ABI, libc no older, CPU features no fewer): bmoe's runtime dependencies,
its llama-cpp-python build among them, packed from this environment's files (each distribution's RECORD),
so such a target needs neither a package index nor the ~10-minute llama.cpp build.

A packed wheel holds the distribution's files under site-packages and its dist-info with a new RECORD;
console scripts are left out (pip writes them again from entry_points.txt), as is anything installed outside
site-packages. Packed wheels are cached in ~/.cache/bmoe/wheels/harness-env ($BMOE_WHEEL_CACHE), keyed by the
installed RECORD's sha256 (a rebuilt distribution of the same version is a new wheel)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness.errors import UserError

_DROP_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
BUILD_TOOLS = ("setuptools", "wheel")  # to build bmoe's C helpers on the target without an index


def cache_dir() -> Path:
    env = os.environ.get("BMOE_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bmoe" / "wheels"


def runtime_closure(root: str = "bmoe", extra: tuple[str, ...] = BUILD_TOOLS) -> list[metadata.Distribution]:
    """The installed distributions bmoe needs at run time (its requirements, theirs, ..., markers evaluated
    here), plus the build tools that are installed; UserError naming one that is missing."""
    seen: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(root, "")] + [(x, "") for x in extra if _installed(x)]
    while todo:
        name, ex = todo.pop()
        key = canonicalize_name(name)
        if (key, ex) in done:
            continue
        done.add((key, ex))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise UserError(f"deploy: {name} (needed by bmoe) is not installed in the harness's environment; "
                            "run scripts/setup.sh, or deploy with --build-on-target") from None
        if key != canonicalize_name(root):
            seen[key] = dist
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ex}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return [seen[k] for k in sorted(seen)]


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def wheel_name(dist: metadata.Distribution) -> str:
    """The wheel file name from the distribution's name, version and WHEEL tags (compressed tag sets)."""
    tags = [ln.split(":", 1)[1].strip() for ln in (dist.read_text("WHEEL") or "").splitlines()
            if ln.startswith("Tag:")]
    if not tags:
        raise UserError(f"deploy: {dist.metadata['Name']} has no WHEEL tags in its dist-info; cannot pack it")
    parts = [list(dict.fromkeys(t.split("-")[i] for t in tags)) for i in range(3)]
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    return f"{name}-{dist.version}-" + "-".join(".".join(p) for p in parts) + ".whl"


def _b64(data_hash: bytes) -> str:
    return base64.urlsafe_b64encode(data_hash).rstrip(b"=").decode()


def pack(dist: metadata.Distribution, out_root: Path | None = None) -> Path:
    """A wheel of an installed distribution (cached: see the module docstring)."""
    record = dist.read_text("RECORD") or ""
    key = hashlib.sha256(record.encode()).hexdigest()[:16]
    out = (out_root or cache_dir() / "harness-env") / key / wheel_name(dist)
    if out.is_file():
        return out
    base = Path(str(dist.locate_file("")))
    files = [f for f in (dist.files or []) if not str(f).startswith("..") and "__pycache__" not in f.parts
             and not str(f).endswith(".pyc")]
    info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info") and f.name == "METADATA"), None)
    if info is None:
        raise UserError(f"deploy: {dist.metadata['Name']} has no dist-info METADATA in its RECORD; cannot pack it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    rows: list[list[str]] = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in files:
            if f.parts[0] == info and f.name in _DROP_INFO:
                continue
            src = base / f
            if not src.is_file():
                continue
            z.write(src, str(f))
            h = hashlib.sha256(src.read_bytes()).digest()
            rows.append([str(f), f"sha256={_b64(h)}", str(src.stat().st_size)])
        rows.append([f"{info}/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        z.writestr(f"{info}/RECORD", buf.getvalue())
    tmp.replace(out)
    return out


# ---- can the target run the harness's binaries --------------------------------------------------------------

# printed by the target's Python (and computed here the same way): what a binary wheel depends on
PROBE = ("import json, platform, sys, sysconfig; print(json.dumps({'version': platform.python_version(), "
         "'soabi': sysconfig.get_config_var('SOABI'), 'machine': platform.machine(), "
         "'libc': list(platform.libc_ver()), 'prefix': sys.prefix}))")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The CPU feature words of /proc/cpuinfo's first `flags` (x86) or `Features` (ARM) line."""
    for line in cpuinfo.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() in ("flags", "Features"):
            return set(v.split())
    return set()


def _ver(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s))


def incompatibility(host: dict, target: dict, host_flags: set[str], target_flags: set[str]) -> str | None:
    """Why the harness's installed binaries may not run on the target (None: they can)."""
    if host.get("soabi") != target.get("soabi"):
        return f"Python ABI {target.get('soabi')} there, {host.get('soabi')} here"
    if host.get("machine") != target.get("machine"):
        return f"machine {target.get('machine')} there, {host.get('machine')} here"
    hl, tl = host.get("libc") or ["", ""], target.get("libc") or ["", ""]
    if hl[0] != tl[0] or _ver(tl[1]) < _ver(hl[1]):
        return f"libc {' '.join(tl) or 'unknown'} there, {' '.join(hl)} here"
    missing = sorted(host_flags - target_flags)
    if missing:
        return f"the target's CPU lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
    return None
