"""One file of a repo into huggingface_hub's cache: resumable, its hash checked before anyone can use it.

huggingface_hub 2.x resumes a download inside one call, but from its last whole 10 MiB chunk (bytes received after
it are dropped and asked again), and it removes its partial file when the call fails, so a Ctrl-C or a failure it
gives up on starts over. Here the bytes are streamed through huggingface_hub's own HTTP session, headers and error
types, each chunk written the moment it arrives to `blobs/<etag>.incomplete`; after a dropped connection, and in a
later pull after a Ctrl-C, the rest is asked with a Range from that file's end, so no byte is read twice. They are
hashed as they arrive (a resumed file's partial part once), and only a file whose sha256 (an LFS file) or git blob id
(a small file kept in git) is the hub's is renamed to `blobs/<etag>`; huggingface_hub's hf_hub_download then links
it into the commit's snapshot as it would its own download. A mismatch removes the partial file and is refused.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from harness.formats.sha_cache import cached_sha256, remember_sha256, stat_ident
from harness.hub import cache
from harness.hub.remote import BadDownload, HubSettings, RemoteFile, hub_errors

Advance = Callable[[int], None]  # bytes newly on disk (negative: bytes dropped), for the one progress bar


class _Hashing:
    """The file object http_get writes to: every byte hashed on its way to disk. A seek back (the server ignored
    a Range and sends the whole file again) truncates there and rehashes what is kept."""

    def __init__(self, f: BinaryIO, new_hash: Callable[[], hashlib._Hash]) -> None:
        self.f, self.new_hash = f, new_hash
        self.h = new_hash()
        for block in iter(lambda: f.read(1 << 22), b""):  # the partial part of a resumed download
            self.h.update(block)

    def write(self, b: bytes) -> int:
        self.h.update(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def truncate(self, size: int | None = None) -> int:
        n = self.f.truncate(size)
        end = self.f.tell() if size is None else size
        self.f.seek(0)
        self.h = self.new_hash()
        left = end
        while left > 0:
            block = self.f.read(min(left, 1 << 22))
            if not block:
                break
            self.h.update(block)
            left -= len(block)
        self.f.seek(end)
        return n


class _Behind:
    """Writes and hashes on a thread of its own, so the next chunk is received meanwhile (hashlib and file writes
    release the GIL); drain() waits for every chunk handed over and re-raises the thread's error (ENOSPC)."""

    def __init__(self, w: _Hashing) -> None:
        self.w, self.err = w, None
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=64)
        self.t = threading.Thread(target=self._run, daemon=True, name="bmoe-pull-writer")
        self.t.start()

    def _run(self) -> None:
        while True:
            b = self.q.get()
            try:
                if b is None:
                    return
                if self.err is None:
                    self.w.write(b)
            except BaseException as e:  # noqa: BLE001 -- handed to the receiving thread by drain()
                self.err = e
            finally:
                self.q.task_done()

    def write(self, b: bytes) -> None:
        if self.err is not None:
            self.drain()
        self.q.put(b)

    def drain(self) -> None:
        self.q.join()
        if self.err is not None:
            e, self.err = self.err, None
            raise e

    def close(self) -> None:
        self.q.put(None)
        self.t.join()


def _hash_kind(f: RemoteFile) -> tuple[str, Callable[[], hashlib._Hash]]:
    """What `f` is checked by: its LFS sha256, else its git blob id (sha1 over "blob <size>\\0" and the bytes)."""
    if f.sha256:
        return f.sha256, hashlib.sha256
    if f.blob_id:
        return f.blob_id, lambda: hashlib.sha1(f"blob {f.size}\0".encode())
    raise BadDownload(f"{f.name}: the hub lists no sha256 or blob id for it, so it cannot be checked; refused")


def verify_cached(path: Path, f: RemoteFile, repo: str) -> None:
    """A file already in the cache (this pull's, or another tool's) is checked once: its sha256 is remembered by
    its stat (harness.formats.sha_cache). A mismatch removes it from the cache and is refused."""
    want, new_hash = _hash_kind(f)
    blob = cache.blob_of(path)
    if f.sha256:
        got = cached_sha256("local", stat_ident(blob.stat()), lambda: _hash_file(blob, new_hash))
    else:
        got = _hash_file(blob, new_hash)
    if got != want:
        _remove(path, blob)
        raise BadDownload(f"{repo}/{f.name}: the cached copy's hash {got[:16]} is not the hub's {want[:16]}; removed "
                          f"it from the cache ({blob}); pull again")


def _hash_file(p: Path, new_hash: Callable[[], hashlib._Hash]) -> str:
    h = new_hash()
    with open(p, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except OSError:
            pass


def fetch(s: HubSettings, repo: str, commit: str, f: RemoteFile, advance: Advance) -> Path:
    """The local path of `f` at `commit` (its snapshot entry), downloaded or continued if needed, hash checked."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    where = f"{repo}/{f.name}"
    hit = try_to_load_from_cache(repo, f.name, cache_dir=str(s.cache_dir), revision=commit)
    if isinstance(hit, str):
        verify_cached(Path(hit), f, repo)
        advance(f.size)
        return Path(hit)
    want, new_hash = _hash_kind(f)
    url = hf_hub_url(repo, f.name, revision=commit, endpoint=s.endpoint)
    headers = build_hf_headers()
    with hub_errors(s, repo, f.name):
        meta = get_hf_file_metadata(url, timeout=s.etag_timeout, headers=headers, endpoint=s.endpoint)
    etag = cache.checked_etag(meta.etag, where)
    if f.sha256 and etag != f.sha256 or meta.size is not None and meta.size != f.size:
        raise BadDownload(f"{where}: the hub's file ({etag[:16]}, {meta.size} bytes) is not the one its listing "
                          f"names ({want[:16]}, {f.size} bytes); refused")
    location = meta.location or url
    if not _same_host(url, location):
        headers.pop("authorization", None)  # as huggingface_hub does: the token stays on the hub
    blob = cache.blob_path(s.cache_dir, repo, etag)
    part = cache.partial_path(s.cache_dir, repo, etag)
    lock = cache.lock_path(s.cache_dir, repo, etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock), hub_errors(s, repo, f.name, part):
        if not blob.exists():
            _download(location, headers, part, f, new_hash, want, advance, s.download_timeout, where)
            os.chmod(part, 0o644 & ~_umask())
            os.replace(part, blob)
            if f.sha256:
                remember_sha256("local", stat_ident(blob.stat()), f.sha256)
        else:
            advance(f.size)
    with hub_errors(s, repo, f.name):  # outside the lock: hf_hub_download takes the same one
        pointer = hf_hub_download(repo, f.name, revision=commit, cache_dir=str(s.cache_dir), endpoint=s.endpoint,
                                  etag_timeout=s.etag_timeout)
    verify_cached(Path(pointer), f, repo)  # a blob another tool left there: checked once (a stat when just made)
    return Path(pointer)


RETRIES = 3  # attempts in a row that bring no new byte, before giving up (a later pull resumes)


def _download(url: str, headers: dict, part: Path, f: RemoteFile, new_hash, want: str, advance: Advance,
              timeout: float, where: str) -> None:
    import httpx2

    have = part.stat().st_size if part.exists() else 0
    if have > f.size:  # not this file's start: begin again
        _remove(part)
        have = 0
    with open(part, "r+b" if have else "w+b") as fh:
        w = _Hashing(fh, new_hash)
        fh.seek(have)
        advance(have)
        idle = 0
        behind = _Behind(w)
        try:
            while have < f.size:
                before = have
                try:
                    _stream(url, headers, w, behind, have, f.size, timeout, advance, where)
                except (httpx2.TransportError, httpx2.TooManyRedirects):
                    behind.drain()
                    if fh.tell() == before and idle >= RETRIES:
                        raise
                behind.drain()
                have = fh.tell()  # every chunk received was written, an interrupted GET's too
                if have == before:
                    idle += 1
                    if idle > RETRIES:
                        raise BadDownload(f"{where}: the hub sent no byte in {RETRIES + 1} tries; pull again later")
                    time.sleep(0.25 * 2 ** idle)
                else:
                    idle = 0
        finally:
            behind.close()  # what was received is on disk before the file closes (a Ctrl-C's partial file too)
        fh.flush()
    got = w.h.hexdigest()
    if got != want:
        _remove(part)
        raise BadDownload(f"{where}: the downloaded bytes hash to {got[:16]}, not the hub's {want[:16]}; refused and "
                          "removed from the cache, pull again (if it happens again, the hub or a proxy is serving "
                          "another file)")


def _stream(url: str, headers: dict, w: _Hashing, behind: _Behind, have: int, size: int, timeout: float,
            advance: Advance, where: str) -> None:
    """One GET of the bytes from `have` on, each chunk written as it arrives."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    h = {**headers, "Accept-Encoding": "identity"}
    if have:
        h["Range"] = f"bytes={have}-"
    with get_session().stream("GET", url, headers=h, timeout=timeout, follow_redirects=True) as r:
        hf_raise_for_status(r)
        if have and r.status_code == 200:  # the server ignored the Range: the whole file again
            behind.drain()
            w.truncate(0)
            advance(-have)
            have = 0
        elif r.status_code == 206:
            start, total = _content_range(r.headers.get("Content-Range", ""))
            if start != have or total != size:
                raise BadDownload(f"{where}: the hub answered bytes from {start} of {total} to a request from "
                                  f"{have} of {size}; refused")
        elif r.status_code != 200:
            raise BadDownload(f"{where}: the hub answered {r.status_code} to a download")
        for chunk in r.iter_raw():
            if have + len(chunk) > size:
                raise BadDownload(f"{where}: the hub sent more than the {size} bytes its listing names; refused")
            behind.write(chunk)
            have += len(chunk)
            advance(len(chunk))


def _content_range(v: str) -> tuple[int, int]:
    """`bytes START-END/TOTAL` -> (START, TOTAL); (-1, -1) when malformed."""
    try:
        unit, _, rest = v.partition(" ")
        span, _, total = rest.partition("/")
        return int(span.split("-", 1)[0]), int(total)
    except ValueError:
        return -1, -1


def _same_host(a: str, b: str) -> bool:
    from urllib.parse import urlparse

    pa, pb = urlparse(a), urlparse(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m
