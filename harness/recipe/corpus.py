"""The training corpus: the reST sources of Python's documentation (Debian's python3.11-doc) and the interpreter's
standard library (libpython3.11-stdlib), both under the PSF License 2.0, which permits this use. Installed from Debian's
registry with `apt-get download` + `dpkg-deb -x` into the recipe's work folder (nothing is installed on the system).

Train and held-out are split by file: a file is held out when the first byte of sha256(its path inside the package)
is below HELDOUT_BYTE, so the split depends on names only and is the same on every machine. The corpus hash is the
sha256 of the sorted `path sha256` lines of every file used, with the package versions beside it.

`split` and `corpus_hash` are pure; `fetch` runs apt-get and dpkg-deb."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("python3.11-doc", "libpython3.11-stdlib")
# both binary packages are built from Debian's one source package python3.11 and carry its one copyright file (the
# stdlib package's doc folder is a link to libpython3.11-minimal's, which holds the same file)
LICENSE_FILES = ("usr/share/doc/python3.11-doc/copyright",)
# which files of the unpacked packages are text for the corpus (paths relative to the unpacked root)
GLOBS = ("usr/share/doc/python3.11/html/_sources/**/*.rst.txt", "usr/lib/python3.11/**/*.py")
HELDOUT_BYTE = 13  # 13/256 = ~5% of files held out
MAX_FILE_BYTES = 2 << 20  # a bigger file is skipped (none in these packages is near it)


@dataclass(frozen=True)
class CorpusFile:
    rel: str  # path inside the unpacked packages
    sha256: str
    size: int
    heldout: bool


def is_heldout(rel: str) -> bool:
    return hashlib.sha256(rel.encode()).digest()[0] < HELDOUT_BYTE


def corpus_hash(files: list[CorpusFile], versions: dict[str, str]) -> str:
    h = hashlib.sha256()
    for pkg in sorted(versions):
        h.update(f"package {pkg} {versions[pkg]}\n".encode())
    for f in sorted(files, key=lambda f: f.rel):
        h.update(f"{f.rel} {f.sha256}\n".encode())
    return h.hexdigest()


def split(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    train = [f for f in files if not f.heldout]
    held = [f for f in files if f.heldout]
    return train, held


def _apt_download(pkg: str, dest: Path) -> tuple[Path, str]:
    dest.mkdir(parents=True, exist_ok=True)
    have = sorted(dest.glob(f"{pkg}_*.deb"))
    if not have:
        r = subprocess.run(["apt-get", "download", pkg], cwd=dest, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"apt-get download {pkg} failed: {r.stderr.strip().splitlines()[-1:]}")
        have = sorted(dest.glob(f"{pkg}_*.deb"))
    deb = have[-1]
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    return deb, version


def fetch(work: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """Download and unpack the packages under work/corpus; return (root, {package: version}, {package: deb sha256})."""
    debs = work / "corpus" / "debs"
    root = work / "corpus" / "root"
    versions: dict[str, str] = {}
    deb_hashes: dict[str, str] = {}
    for pkg in PACKAGES:
        deb, version = _apt_download(pkg, debs)
        versions[pkg] = version
        deb_hashes[pkg] = hashlib.sha256(deb.read_bytes()).hexdigest()
    if not (root / ".unpacked").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (root / ".unpacked").write_text("ok\n")
    return root, versions, deb_hashes


def list_files(root: Path) -> list[CorpusFile]:
    out: list[CorpusFile] = []
    seen: set[str] = set()
    for pattern in GLOBS:
        for p in sorted(root.glob(pattern)):
            if not p.is_file() or p.is_symlink():
                continue
            rel = p.relative_to(root).as_posix()
            size = p.stat().st_size
            if rel in seen or size == 0 or size > MAX_FILE_BYTES:
                continue
            seen.add(rel)
            out.append(CorpusFile(rel, hashlib.sha256(p.read_bytes()).hexdigest(), size, is_heldout(rel)))
    return out


_HEADING = re.compile(r"^(.+)\n([=\-~^\"'`#*+]{3,})\s*$", re.M)
_ROLE = re.compile(r":[\w:.-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_DIRECTIVE = re.compile(r"^\.\. (?:function|method|class|exception|attribute|data|decorator):: (.+)$", re.M)


def _plain(title: str) -> str:
    return _ROLE.sub(r"\1", title).replace("``", "").strip()


def _cut(body: str, max_chars: int) -> str:
    if len(body) <= max_chars:
        return body
    cut = body.rfind("\n\n", 0, max_chars)
    return body[:cut if cut > 200 else max_chars].rstrip()


def sections(text: str, max_chars: int = 1200) -> list[tuple[str, str]]:
    """(title, body) pairs of a reST text, for chat-formatted samples (the title asked, the body answered), so the
    chat template is trained, not only present:
    - a heading (a line underlined by 3+ punctuation): the text up to the next heading;
    - an API directive (`.. function:: name(args)` and kin): its indented block, dedented.
    Bodies are cut at max_chars on a paragraph break; role markup is stripped from titles."""
    out: list[tuple[str, str]] = []
    marks = list(_HEADING.finditer(text))
    for i, m in enumerate(marks):
        title = _plain(m.group(1))
        if not title or len(title) > 80 or title.startswith(".."):
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = _cut(text[m.end():end].strip(), max_chars)
        if len(body) >= 80:
            out.append((title, body))
    lines = text.split("\n")
    starts = {text.count("\n", 0, m.start()): _plain(m.group(1)) for m in _DIRECTIVE.finditer(text)}
    for ln, title in starts.items():
        block: list[str] = []
        for line in lines[ln + 1:]:
            if line.strip() and not line.startswith((" ", "\t")):
                break
            block.append(line)
        body = "\n".join(x[3:] if x.startswith("   ") else x.lstrip() for x in block).strip()
        body = "\n".join(x for x in body.split("\n") if not x.startswith(":"))  # directive options
        body = _cut(body.strip(), max_chars)
        if len(body) >= 40 and len(title) <= 100:
            out.append((title, body))
    return out
