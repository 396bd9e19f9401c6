"""huggingface_hub's cache layout, as far as bmoe needs it: a repo's folder, a commit's files (offline mode: what
was pulled before, with no network), where a blob and its partial download go, and the lock huggingface_hub takes
for one blob.

    <cache>/models--org--name/refs/<revision>            the commit a branch or tag pointed at when last pulled
    <cache>/models--org--name/snapshots/<commit>/<file>  a link to ../../blobs/<etag>
    <cache>/models--org--name/blobs/<etag>               the content (an LFS file's etag is its sha256)
    <cache>/models--org--name/blobs/<etag>.incomplete    a download in progress: bmoe resumes it
    <cache>/.locks/models--org--name/<etag>.lock
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.errors import UserError
from harness.hub.spec import BadHubName, check_file_name

_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def repo_dir(cache_dir: Path, repo: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir / repo_folder_name(repo_id=repo, repo_type="model")


def checked_etag(etag: str | None, what: str) -> str:
    """An etag from the network becomes a file name: only a sha1 or sha256 in hex is taken."""
    if etag is None or not _ETAG.fullmatch(etag):
        raise BadHubName(f"{what}: the hub's etag {str(etag)[:80]!r} is not a content hash; refused before any "
                         "path was made (is HF_ENDPOINT a hub?)")
    return etag


def blob_path(cache_dir: Path, repo: str, etag: str) -> Path:
    return repo_dir(cache_dir, repo) / "blobs" / etag


def partial_path(cache_dir: Path, repo: str, etag: str) -> Path:
    return repo_dir(cache_dir, repo) / "blobs" / f"{etag}.incomplete"


def lock_path(cache_dir: Path, repo: str, etag: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir / ".locks" / repo_folder_name(repo_id=repo, repo_type="model") / f"{etag}.lock"


def cached_commit(cache_dir: Path, repo: str, revision: str) -> str | None:
    """The commit `revision` names in the cache: itself when it is a commit sha, else the ref recorded when it was
    last pulled; None when it was never pulled."""
    if _COMMIT.fullmatch(revision):
        return revision if (repo_dir(cache_dir, repo) / "snapshots" / revision).is_dir() else None
    ref = repo_dir(cache_dir, repo) / "refs" / revision
    try:
        sha = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return sha if _COMMIT.fullmatch(sha) else None


def record_ref(cache_dir: Path, repo: str, revision: str, commit: str) -> None:
    """refs/<revision> = commit, as huggingface_hub records a branch it resolved (offline mode reads it back)."""
    if _COMMIT.fullmatch(revision):
        return
    ref = repo_dir(cache_dir, repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit, encoding="utf-8")
    os.replace(tmp, ref)


def snapshot_files(cache_dir: Path, repo: str, commit: str) -> dict[str, Path]:
    """The files of a commit's snapshot that are complete (a link to a blob that exists), by repo-relative name."""
    root = repo_dir(cache_dir, repo) / "snapshots" / commit
    out: dict[str, Path] = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in sorted(names):
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            try:
                check_file_name(rel)
            except BadHubName:
                continue
            if p.is_file():  # follows the link: a dangling one is not a file
                out[rel] = p
    return dict(sorted(out.items()))


def blob_of(pointer: Path) -> Path:
    """The blob a snapshot entry links to (the entry itself where the cache copies instead of linking)."""
    return pointer.resolve()


def etag_of(pointer: Path) -> str:
    name = blob_of(pointer).name
    if not _ETAG.fullmatch(name):
        raise UserError(f"{pointer}: not a file of huggingface_hub's cache (its blob is named {name!r})")
    return name
