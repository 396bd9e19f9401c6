"""What `bmoe-bench deploy` puts on a target and how a run checks it: the harness's own version (its version
number and the sha256 of its source files, so any change to the code is a new version), the source archive
shipped to the target (built from this checkout's files, the same ones hashed), and the stamp the target
keeps in DIR/deploy.json. Pure apart from reading the source files.

The stamp records what was installed; deploy compares the wanted one with it key by key (STAMP_KEYS) and does
nothing when they match. A run refuses a target whose stamp is missing or names another version."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from functools import lru_cache
from pathlib import Path

from harness import __version__
from harness.errors import UserError

LLAMA_CPP_PYTHON = "0.3.36"  # pyproject.toml's pin (tests check they agree)
# as scripts/setup.sh builds it: no tools, examples, tests or server, and no llamafile sgemm (byte-identity
# of verify batches, tests/gates/test_batch_exact.py)
CMAKE_ARGS = ("-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
              "-DLLAMA_BUILD_SERVER=OFF -DGGML_LLAMAFILE=OFF")
STAMP_FILE = "deploy.json"
# the keys whose equality makes a deploy a no-op (the rest of the stamp is a record)
STAMP_KEYS = ("bmoe", "llama_cpp_python", "llamafile", "python", "system_site_packages")
_TOP = ("pyproject.toml", "setup.py")
_SKIP_SUFFIXES = (".pyc", ".so", ".o", ".pyd")


def source_root() -> Path:
    """The checkout the harness runs from (the folder holding pyproject.toml beside harness/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise UserError(f"deploy needs the harness's source checkout (pyproject.toml beside {root / 'harness'}); "
                        "run bmoe-bench from a clone of the repository")
    return root


def source_files(root: Path) -> list[str]:
    """The files that make the package, relative to root, sorted: pyproject.toml, setup.py and harness/
    without caches or built objects."""
    out = [t for t in _TOP if (root / t).is_file()]
    for p in sorted((root / "harness").rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and "__pycache__" not in rel.parts and not p.name.endswith(_SKIP_SUFFIXES) \
                and not any(x.endswith(".egg-info") for x in rel.parts):
            out.append(str(rel))
    return out


def source_sha256(root: Path, files: list[str]) -> str:
    h = hashlib.sha256()
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


@lru_cache(maxsize=1)
def harness_version() -> str:
    """This harness's version as a deploy stamps it: 0.1.0+src.<12 hex of its source files' sha256>."""
    root = source_root()
    return f"{__version__}+src.{source_sha256(root, source_files(root))[:12]}"


def source_archive(dest_dir: Path) -> Path:
    """An sdist-shaped archive of the package (bmoe-0.1.0/ with pyproject.toml, setup.py, harness/), the same
    bytes for the same files (sorted, no owners, mtime 0); the source hash is not in its name (pip would refuse
    a name whose version is not the metadata's): deploy puts it in a folder named after it."""
    root = source_root()
    out = Path(dest_dir) / f"bmoe-{__version__}.tar.gz"  # pip checks the name's version against the metadata
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in source_files(root):
            data = (root / rel).read_bytes()
            info = tarfile.TarInfo(f"bmoe-{__version__}/{rel}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(gzip.compress(buf.getvalue(), compresslevel=6, mtime=0))  # tarfile's "w:gz" stamps the time
    tmp.replace(out)
    return out


def wanted_stamp(python_version: str, system_site_packages: bool) -> dict:
    return {"bmoe": harness_version(), "llama_cpp_python": LLAMA_CPP_PYTHON, "llamafile": False,
            "python": python_version, "system_site_packages": system_site_packages}


def parse_stamp(text: str | None) -> dict | None:
    """The target's deploy.json, or None when absent or unreadable (a deploy then starts over)."""
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def differences(have: dict | None, want: dict) -> list[str]:
    """What differs between the target's stamp and the wanted one, as `key: have -> want` (empty: up to date)."""
    if have is None:
        return ["not deployed"]
    return [f"{k}: {have.get(k)!r} -> {want[k]!r}" for k in STAMP_KEYS if have.get(k) != want[k]]


def run_refusal(stamp_text: str | None, label: str, target_dir: str, fix: str) -> str | None:
    """Why a campaign may not run bmoe on this target (one line naming the command that fixes it), or None."""
    have = parse_stamp(stamp_text)
    if have is None:
        return f"ssh target {label}: bmoe is not deployed in {target_dir} (no {STAMP_FILE}); run `{fix}`"
    if have.get("bmoe") != harness_version():
        return (f"ssh target {label}: bmoe {have.get('bmoe')} is deployed in {target_dir}, the harness is "
                f"{harness_version()}; run `{fix}`")
    return None
