"""A pull from start to end: the repo's files at a commit (from the hub, or from the cache offline), the model file
picked as llama.cpp's -hf picks it with every shard of a split model, the free space checked before the first byte,
each file fetched in turn under one progress bar, and what came from where (repo, commit, each file's sha256)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.formats.files import DiskFull
from harness.hub import cache
from harness.hub.fetch import Advance, fetch, verify_cached
from harness.hub.remote import HubSettings, RemoteFile, RepoListing, listing
from harness.hub.spec import HubRef, pick_file, quants_in, shards_of

Bar = Callable[[int, str], AbstractContextManager[Advance]]  # (total bytes, label) -> the bar's advance


@dataclass(frozen=True)
class PulledFile:
    name: str  # repo-relative
    path: Path  # the snapshot entry in the cache (a split model's shards side by side, as llama.cpp wants them)
    sha256: str | None  # None only for a small non-LFS file (checked by its git blob id)
    size: int


@dataclass(frozen=True)
class Pulled:
    repo: str
    revision: str
    commit: str
    files: tuple[PulledFile, ...]
    fetched: int  # bytes downloaded by this pull (0: all were cached)

    @property
    def path(self) -> Path:
        """The model file to give -m: the only file, or the first shard."""
        return self.files[0].path


@dataclass(frozen=True)
class Plan:
    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


def plan(ref: HubRef, s: HubSettings) -> Plan:
    """What `ref` names: from the hub's listing, or offline from the cache."""
    if s.offline:
        return _plan_offline(ref, s)
    lst = listing(s, ref.repo, ref.revision)
    names = list(lst.files)
    return Plan(ref.repo, ref.revision, lst.commit, tuple(lst.files[n] for n in _chosen(ref, names, lst)))


def _chosen(ref: HubRef, names: list[str], lst: RepoListing | None, where: str = "") -> list[str]:
    ggufs = [n for n in names if n.endswith(".gguf")]
    if ref.file:
        if ref.file not in names:
            refused = f" (the hub listed {len(lst.skipped)} unsafe name(s), refused)" if lst and lst.skipped else ""
            raise UserError(f"{ref.repo} has no file {ref.file}{where}{refused}; its GGUFs: "
                            f"{', '.join(ggufs[:20]) or 'none'}")
        first = ref.file
    else:
        picked = pick_file(names, ref.tag)
        if picked is None:
            tags = quants_in(names)
            if not tags and not ggufs:
                raise UserError(f"{ref.repo} has no GGUF model file{where}; bmoe runs GGUFs (llama.cpp's format)")
            raise UserError(f"{ref.repo} has no {ref.tag} GGUF{where}; its quants: {', '.join(tags) or 'none named'} "
                            f"(e.g. bmoe pull {ref.repo}:{(tags or ['Q8_0'])[0]})")
        first = picked
    try:
        return shards_of(names, first)
    except UserError as e:
        raise UserError(f"{ref.repo}: {e}{where}") from None


def _plan_offline(ref: HubRef, s: HubSettings) -> Plan:
    commit = cache.cached_commit(s.cache_dir, ref.repo, ref.revision)
    if commit is None:
        raise UserError(f"{ref.repo}: HF_HUB_OFFLINE is set and revision {ref.revision} was never pulled into "
                        f"{s.cache_dir}; pull it once online (or unset HF_HUB_OFFLINE)")
    entries = cache.snapshot_files(s.cache_dir, ref.repo, commit)
    names = _chosen(ref, list(entries), None, " in the cache (HF_HUB_OFFLINE)")
    files = []
    for n in names:
        etag = cache.etag_of(entries[n])
        size = entries[n].stat().st_size
        files.append(RemoteFile(n, size, etag if len(etag) == 64 else None, etag if len(etag) == 40 else None))
    return Plan(ref.repo, ref.revision, commit, tuple(files))


def _nearest_dir(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_space(s: HubSettings, p: Plan) -> int:
    """The bytes still to download (what is cached or partly downloaded counts as there); DiskFull before the
    first byte when the cache's filesystem has less free."""
    need = 0
    for f in p.files:
        etag = f.sha256 or f.blob_id or ""
        if etag and cache.blob_path(s.cache_dir, p.repo, etag).exists():
            continue
        part = cache.partial_path(s.cache_dir, p.repo, etag) if etag else None
        need += f.size - (part.stat().st_size if part is not None and part.exists() else 0)
    if need <= 0:
        return 0
    where = _nearest_dir(s.cache_dir)
    free = shutil.disk_usage(where).free
    if free < need:
        raise DiskFull(f"{where}: {_mib(free)} free, {p.repo} needs {_mib(need)} more; free space there (or set "
                       "HF_HUB_CACHE elsewhere) and pull again")
    return need


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@contextlib.contextmanager
def _no_bar(total: int, label: str) -> Iterator[Advance]:
    yield lambda n: None


def pull(ref: HubRef, s: HubSettings, bar: Bar | None = None) -> Pulled:
    """Every file `ref` names, in the cache and checked; downloads what is missing, one file after another."""
    p = plan(ref, s)
    if s.offline:
        files = []
        for f in p.files:
            path = cache.snapshot_files(s.cache_dir, p.repo, p.commit)[f.name]
            verify_cached(path, f, p.repo)
            files.append(PulledFile(f.name, path, f.sha256, f.size))
        return Pulled(p.repo, p.revision, p.commit, tuple(files), 0)
    need = check_space(s, p)
    label = p.files[0].name + (f" (+{len(p.files) - 1} shards)" if len(p.files) > 1 else "")
    out = []
    with (bar or _no_bar)(p.total, label) as advance:
        for f in p.files:
            path = fetch(s, p.repo, p.commit, f, advance)
            out.append(PulledFile(f.name, path, f.sha256, f.size))
    cache.record_ref(s.cache_dir, p.repo, p.revision, p.commit)
    return Pulled(p.repo, p.revision, p.commit, tuple(out), need)
