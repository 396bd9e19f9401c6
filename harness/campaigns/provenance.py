"""What exactly a campaign ran, for its manifest (harness.formats.manifest.Provenance): the model files'
sha256, each engine's identity, the device's fingerprint and the storage it reads the model from
(harness.devices.storage); on several devices each one's fingerprint and storage (`device_provenance`).

A file's sha256 is computed once and cached by where it is (this machine, or the adb serial), its device
number, inode, size and mtime, in ~/.cache/bmoe/sha256.json ($BMOE_HASH_CACHE): a 60 GB model is hashed
once, then every run only stats it. Over adb the device hashes its own copy (`sha256sum`, or toybox's),
so nothing is pulled. The runner hashes the model again (a stat, normally) before every run and fails a
run whose model no longer matches the campaign's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.campaigns.pagecache import model_files
from harness.deploy.stamp import source_root
from harness.devices.parse import file_sha256
from harness.devices.sh import script
from harness.devices.storage import STORAGE_SCRIPT, parse_storage, read_local
from harness.errors import UserError
from harness.formats.campaign_fleet import DEFAULT_SERVER
from harness.formats.manifest import DeviceFingerprint, DeviceProvenance, EngineIdentity, Provenance
from harness.formats.sha_cache import cache_path as cache_path  # re-exported: tests read the cache
from harness.formats.sha_cache import cached_sha256
from harness.formats.storage import Storage

# the llama.cpp commit vendored by the llama-cpp-python release pyproject.toml pins (its CHANGELOG:
# "0.3.36: update llama.cpp to ggml-org/llama.cpp@0c1e57098"); tests/test_provenance.py checks the pin
LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"


# ---- on the target ---------------------------------------------------------------------------------------

_SHARD = re.compile(r"^(?P<stem>.+)-00001-of-(?P<n>\d{5})\.gguf$")
_STAT_SCRIPT = 'stat -c "%d %i %s %Y" "$1"'


def _target_files(path: str) -> list[str]:
    """The model path on the target, or every shard of a split model given its first."""
    m = _SHARD.match(path.rsplit("/", 1)[-1])
    if not m:
        return [path]
    d = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    n = int(m["n"])
    return [f"{d}{m['stem']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]


def local_sha256(p: Path) -> str:
    try:
        st = p.stat()
    except OSError as e:
        raise UserError(f"{p}: cannot hash it ({e.strerror}); is the path right?") from None
    return cached_sha256("local", (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), lambda: file_sha256(p))


def adb_sha256(device, path: str, where: str = "adb") -> str:
    """sha256 of a file on an adb device or an SSH machine (a harness.devices.remote.RemoteShell), by its own
    sha256sum, cached under `where`:serial."""
    code, out, err = device.shell(script(_STAT_SCRIPT, path))
    parts = out.split()
    if code != 0 or len(parts) != 4 or not all(x.isdigit() for x in parts):
        why = (err or out).strip() or f"exit {code}"
        raise UserError(f"{where} device {device.serial}: cannot stat {path} ({why})")
    ident = tuple(int(x) for x in parts)

    def compute() -> str:
        h = device.remote_sha256(path)
        if h is None:
            raise UserError(f"{where} device {device.serial}: sha256sum {path} failed; is the file readable there?")
        return h

    client = getattr(device, "client", None)  # adb: its server (a serial is unique per server); SSH: none
    server = client.name if client is not None and client.name != DEFAULT_SERVER else ""
    return cached_sha256(f"{where}:{device.serial}" + (f"@{server}" if server else ""), ident, compute)  # type: ignore


def target_sha256(target, path: str) -> str:
    """sha256 of a file as the target sees it (the local file, or the device's copy)."""
    if target.kind in ("adb", "ssh"):
        return adb_sha256(target.device, path, target.kind)
    return local_sha256(Path(path))


def model_sha256(target, model_path: str) -> dict[str, str]:
    """File name -> sha256 of the model (every shard of a split model) on the target."""
    if target.kind in ("adb", "ssh"):
        return {f.rsplit("/", 1)[-1]: target_sha256(target, f) for f in _target_files(model_path)}
    return {p.name: local_sha256(p) for p in model_files(Path(model_path))}


# ---- engines and devices ---------------------------------------------------------------------------------

def _git(cwd: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def source_tree(argv0: list[str]) -> Path | None:
    """The folder the bmoe executable loads its `harness` package from (asked of its own interpreter, run
    outside any checkout so the current directory cannot shadow it), or None when that cannot be told."""
    exe = Path(argv0[0])
    py = sys.executable
    try:
        first = exe.read_text(errors="replace").splitlines()[0] if exe.is_file() else ""
    except OSError:
        first = ""
    if first.startswith("#!") and "python" in first:
        py = first[2:].strip().split()[0]
    try:
        p = subprocess.run([py, "-c", "import harness, os; print(os.path.dirname(os.path.dirname(harness.__file__)))"],
                           cwd="/", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = p.stdout.strip()
    return Path(out) if p.returncode == 0 and out else None


def bmoe_identity(version: str, argv0: list[str], tree: Path | None = None) -> EngineIdentity:
    """bmoe's version line, the pinned llama.cpp commit, and the commit and state of its source tree (`tree`, else
    the one its executable loads)."""
    tree = tree or source_tree(argv0)
    head = _git(tree, "rev-parse", "HEAD") if tree is not None else None
    status = _git(tree, "status", "--porcelain", "--untracked-files=no") if head is not None else None
    return EngineIdentity(version=version, llama_cpp=f"{LLAMA_CPP_COMMIT} (llama-cpp-python {LLAMA_CPP_PYTHON})",
                          commit=head, dirty=bool(status) if status is not None else None)


def external_identity(target, version: str, exe: str) -> EngineIdentity:
    """An external engine: its --version line and the sha256 of its executable on the target."""
    return EngineIdentity(version=version, sha256=target_sha256(target, exe))


_FINGERPRINT_SCRIPT = r"""for p in ro.build.fingerprint ro.soc.model ro.board.platform ro.build.version.release; do
  echo "$p=$(getprop "$p" 2>/dev/null)"
done"""


def device_fingerprint(target, desc: dict) -> DeviceFingerprint:
    """From the target's description (harness.targets: describe()), plus the build properties over adb."""
    if target.kind == "ssh":  # a board, or Termux (where getprop answers)
        return DeviceFingerprint(kind="ssh", soc=desc.get("platform"), android=desc.get("android_release"),
                                 cpu_model=desc.get("hardware"), kernel=desc.get("kernel"),
                                 mem_total_mib=desc.get("mem_total_mib"))
    if target.kind != "adb":
        return DeviceFingerprint(kind="local", cpu_model=desc.get("cpu_model"), kernel=desc.get("kernel"),
                                 mem_total_mib=desc.get("mem_total_mib"))
    dev = target.device
    code, out, _ = dev.shell(script(_FINGERPRINT_SCRIPT))
    props = {k: (v.strip() or None) for k, v in (ln.split("=", 1) for ln in out.splitlines() if "=" in ln)} \
        if code == 0 else {}
    return DeviceFingerprint(kind="adb", fingerprint=props.get("ro.build.fingerprint"),
                             soc=props.get("ro.soc.model") or props.get("ro.board.platform"),
                             android=props.get("ro.build.version.release"), cpu_model=desc.get("hardware"),
                             kernel=desc.get("kernel"), mem_total_mib=desc.get("mem_total_mib"))



STORAGE_TIMEOUT_S = 60.0  # the O_DIRECT probe reads 4 KiB; sysfs and mountinfo are small


def target_storage(target, model_path: str) -> Storage:
    """The storage under the model on the target (harness.devices.storage). A device that does not answer gives a
    record saying so (kind unknown), not an error: the campaign can run, its findings show what is not known."""
    first = _target_files(model_path)[0] if target.kind in ("adb", "ssh") else model_path
    if target.kind not in ("adb", "ssh"):
        return read_local(first)
    dev = target.device
    try:
        _, out, _ = dev.shell(script(STORAGE_SCRIPT, first), timeout=STORAGE_TIMEOUT_S)
    except dev.gone as e:
        return Storage(path=first.rsplit("/", 1)[0] or "/", kind="unknown", o_direct_how=f"the device went away: {e}")
    return parse_storage(out)


def device_provenance(target, desc: dict, model_path: str) -> DeviceProvenance:
    """One device of a campaign on several: its fingerprint and the storage under its copy of the model."""
    return DeviceProvenance(fingerprint=device_fingerprint(target, desc), storage=target_storage(target, model_path))


def campaign_provenance(plan, target, res, desc: dict) -> Provenance:
    """The provenance of a new campaign folder (plan: campaigns.validate.Plan; res: runner.Resolved)."""
    c = plan.campaign
    engines = {}
    for label in c.engine_labels():
        kind = c.engine_of(label).kind
        argv0 = res.argv0(label)
        version = res.engines[label].version if label else res.engine_version
        # ssh: deployed from the harness's own tree (the run checked its source hash), whatever a venv here loads
        tree = source_root() if kind == "bmoe" and target.kind == "ssh" else None
        engines[label or kind] = (bmoe_identity(version, argv0, tree) if kind == "bmoe"
                                  else external_identity(target, version, argv0[0]))
    return Provenance(model_sha256=model_sha256(target, res.model_path), engines=engines,
                      device=device_fingerprint(target, desc), storage=target_storage(target, res.model_path),
                      **({"hub": res.hub} if res.hub is not None else {}))


def model_mismatch(want: dict[str, str], have: dict[str, str]) -> str | None:
    """Why a run may not use the model as it is now (another file than the campaign's), or None."""
    if have == want:
        return None
    diff = [f"{k}: {(have.get(k) or 'absent')[:12]} (campaign: {(want.get(k) or 'absent')[:12]})"
            for k in sorted(set(want) | set(have)) if want.get(k) != have.get(k)]
    return (f"the model file changed since the campaign started ({'; '.join(diff)}, sha256); runs of two "
            f"models do not compare: restore it, or start over with --fresh")
