"""A real Hugging Face hub on loopback for huggingface_hub and `bmoe pull`: the endpoints huggingface_hub 2.x calls,
read from its source (hf_api.model_info, file_download.get_hf_file_metadata / http_get), served from folders of files.

    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   sha and siblings (with blobs: size, blobId, lfs sha256)
    GET  /api/models/{repo}/tree/{rev}[/{path}]             the file tree (llama.cpp's -hf lists files this way)
    HEAD /{repo}/resolve/{rev}/{file}   an LFS file: 302 to the CDN with X-Repo-Commit, X-Linked-Etag, X-Linked-Size
    GET  /{repo}/resolve/{rev}/{file}   and ETag; a small file: 200 with its git blob id as ETag
    GET  /cdn/{sha256}                  the bytes, with Range (206, Content-Range), from a second server: another
                                        origin, as the hub's CDN is another host

`Hub.add_repo(repo, folder)` serves every file under a folder (GGUFs made by bmoe's writer, or by llama.cpp's own
tools: drop them in); a .gguf or a file over 10 MiB is an LFS file (its bytes from the CDN), the rest small git files,
as on the hub. Every request is logged (method, path, Range, status, body bytes sent) when it arrives, before any
answer: a client that has its answer finds its request in the log already. The status is set before the answer is
sent and the byte count before each block is written (taken back if the write fails), so both are final by the time
the client has read them. Faults are switches on the Hub: cut a file's connection after N bytes, hang, corrupt a
file's bytes, redirect the API to another host, a gated repo, unsafe names in a listing, a call-back after N bytes
(to fill a disk mid-download).
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

CHUNK = 1 << 16
REPO = "org/tiny"  # the tests' repo (tests/hub/conftest.py)


@dataclass
class HubFile:
    name: str
    path: Path
    size: int
    sha256: str
    git_sha1: str  # the git blob id of the content
    lfs: bool


@dataclass
class Repo:
    repo: str
    files: dict[str, HubFile]
    commit: str
    gated: bool = False
    extra_names: list[str] = field(default_factory=list)  # listed, never served (unsafe names)


@dataclass
class LogEntry:
    server: str  # hub or cdn
    method: str
    path: str
    range: str | None
    status: int
    sent: int  # body bytes written
    auth: bool
    done: bool = False  # the handler has finished with it


def _hashes(p: Path) -> tuple[str, str, int]:
    size = p.stat().st_size
    s256, s1 = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            s256.update(b)
            s1.update(b)
    return s256.hexdigest(), s1.hexdigest(), size


class Hub:
    def __init__(self, lfs_threshold: int = 10 << 20) -> None:
        _fresh_http_session()
        self.repos: dict[str, Repo] = {}
        self.log: list[LogEntry] = []
        self.lfs_threshold = lfs_threshold
        self.tokens = {"hf_good"}  # tokens with access to gated repos
        # fault switches
        self.cut_after: dict[str, int] = {}  # file name -> cut the next GET of it after this many bytes (once)
        self.hang: set[str] = set()  # "api", "head", "body": block there until released (or stop)
        self.corrupt: set[str] = set()  # file names served with one byte flipped
        self.api_redirect: str | None = None  # an URL the model-info call is redirected to
        self.on_bytes: tuple[str, int, Callable[[], None]] | None = None  # (file, after N bytes, call once)
        self.throttle: float = 0.0  # seconds to sleep per CHUNK (a slow link, for Ctrl-C tests)
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.hub = _serve(self, "hub")
        self.cdn = _serve(self, "cdn")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def add_repo(self, repo: str, folder: Path, gated: bool = False, lfs_all: bool = False) -> Repo:
        files = {}
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                s256, s1, size = _hashes(p)
                name = p.relative_to(folder).as_posix()
                lfs = lfs_all or size > self.lfs_threshold or name.endswith(".gguf")
                files[name] = HubFile(name, p, size, s256, s1, lfs)
        commit = hashlib.sha1(json.dumps([repo, [(f.name, f.sha256) for f in files.values()]]).encode()).hexdigest()
        r = Repo(repo, files, commit, gated)
        self.repos[repo] = r
        return r

    def requests(self, path_part: str = "", method: str | None = None) -> list[LogEntry]:
        with self._lock:
            return [e for e in self.log if path_part in e.path and (method is None or e.method == method)]

    def record(self, e: LogEntry) -> None:
        with self._lock:
            self.log.append(e)

    def close(self) -> None:
        self.release.set()
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()
        _fresh_http_session()


def _fresh_http_session() -> None:
    """The tests pull in this process, and huggingface_hub keeps its keep-alive connections in one client for the
    whole process: closed with each hub, so no test reuses a connection another test's hub left (a later hub can
    get the same port) and every test starts from the state a fresh `bmoe pull` has."""
    from huggingface_hub.utils import close_session

    close_session()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        """A client gone mid-response (the fault tests cut, fill or abandon downloads) is expected: kept in `errors`,
        not printed, since socketserver's traceback on stderr would land in an in-process pull's captured stderr."""
        self.__dict__.setdefault("errors", []).append(sys.exc_info()[1])


def _serve(hub: Hub, name: str) -> _Server:
    handler = type(f"{name}Handler", (_Handler,), {"hub": hub, "server_name_": name})
    srv = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True, name=f"hub-{name}").start()
    return srv


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: Hub
    server_name_: str

    def log_message(self, *args) -> None:  # quiet
        pass

    # ---- plumbing --------------------------------------------------------------------------------------------
    def _arrived(self) -> None:
        self.entry = LogEntry(self.server_name_, self.command, self.path, self.headers.get("Range"), 0, 0,
                              "Authorization" in self.headers)
        self.hub.record(self.entry)

    def _status(self, status: int) -> None:
        self.entry.status = status
        self.send_response(status)

    def _done(self, status: int, sent: int | None = None) -> None:
        self.entry.status = status
        if sent is not None:
            self.entry.sent = sent
        self.entry.done = True

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              head_only: bool = False) -> None:
        self._status(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.entry.sent = 0 if head_only else len(body)  # counted before it is written: see the module's docstring
        self.end_headers()
        if not head_only and body:
            self.wfile.write(body)
        self._done(status)

    def _json(self, obj: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, msg: str, head_only: bool = False) -> None:
        self._send(status, json.dumps({"error": msg}).encode(), {"X-Error-Code": code, "X-Error-Message": msg,
                                                                  "Content-Type": "application/json"}, head_only)

    def _hang(self, where: str) -> bool:
        if where in self.hub.hang:
            self.hub.release.wait(60)
            self.close_connection = True
            return True
        return False

    def do_GET(self) -> None:
        self._route(head_only=False)

    def do_HEAD(self) -> None:
        self._route(head_only=True)

    def _route(self, head_only: bool) -> None:
        self._arrived()
        u = urlparse(self.path)
        path = unquote(u.path)
        q = parse_qs(u.query)
        if self.server_name_ == "cdn":
            return self._cdn(path, q, head_only)
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/"):], q)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self._resolve("/".join(parts[:2]), parts[3], parts[4], head_only)
        self._error(404, "EntryNotFound", "no such route", head_only)

    # ---- the API ---------------------------------------------------------------------------------------------
    def _repo(self, repo: str, rev: str, head_only: bool = False) -> Repo | None:
        r = self.hub.repos.get(repo)
        if r is None:
            self._error(404, "RepoNotFound", "Repository not found", head_only)
            return None
        if rev not in ("main", r.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id", head_only)
            return None
        return r

    def _api(self, rest: str, q: dict) -> None:
        if self._hang("api"):
            return
        if self.hub.api_redirect:
            return self._send(302, b"", {"Location": self.hub.api_redirect})
        segs = rest.split("/")
        repo, tail = "/".join(segs[:2]), segs[2:]
        rev = "main"
        if tail[:1] == ["revision"] and len(tail) >= 2:
            rev = "/".join(tail[1:])
        elif tail[:1] == ["tree"] and len(tail) >= 2:
            return self._tree(repo, tail[1], "/".join(tail[2:]))
        r = self._repo(repo, rev)
        if r is None:
            return
        blobs = q.get("blobs", ["false"])[0] == "true"
        sib = []
        for f in r.files.values():
            s: dict = {"rfilename": f.name}
            if blobs:
                s.update(size=f.size, blobId=f.git_sha1)
                if f.lfs:
                    s["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            sib.append(s)
        sib += [{"rfilename": n, **({"size": 1, "blobId": "0" * 40} if blobs else {})} for n in r.extra_names]
        self._json({"_id": r.commit[:24], "id": r.repo, "modelId": r.repo, "sha": r.commit, "private": False,
                    "gated": "auto" if r.gated else False, "disabled": False, "tags": ["gguf"], "siblings": sib,
                    "lastModified": "2026-12-01T00:00:00.000Z", "createdAt": "2026-12-01T00:00:00.000Z"})

    def _tree(self, repo: str, rev: str, under: str) -> None:
        r = self._repo(repo, rev)
        if r is None:
            return
        out = []
        for f in r.files.values():
            if under and not f.name.startswith(under.rstrip("/") + "/"):
                continue
            e: dict = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.name}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(e)
        self._json(out)

    # ---- resolve and the CDN ---------------------------------------------------------------------------------
    def _resolve(self, repo: str, rev: str, name: str, head_only: bool) -> None:
        if head_only and self._hang("head"):
            return
        r = self._repo(repo, rev, head_only)
        if r is None:
            return
        if r.gated:
            auth = self.headers.get("Authorization", "")
            if not auth:
                return self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access "
                                   "to it and be authenticated to access it. Please log in.", head_only)
            if auth.removeprefix("Bearer ") not in self.hub.tokens:
                return self._error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in the "
                                   "authorized list.", head_only)
        f = r.files.get(name)
        if f is None:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": r.commit}, head_only)
        common = {"X-Repo-Commit": r.commit, "Accept-Ranges": "bytes"}
        if f.lfs:
            loc = f"{self.hub.cdn_url}/cdn/{f.sha256}?name={name}"
            return self._send(302, b"", {**common, "Location": loc, "X-Linked-Etag": f'"{f.sha256}"',
                                         "X-Linked-Size": str(f.size), "ETag": f'"{f.git_sha1}"'}, head_only)
        self._body(f, {**common, "ETag": f'"{f.git_sha1}"'}, head_only)

    def _cdn(self, path: str, q: dict, head_only: bool) -> None:
        if path.startswith("/api/"):  # the foreign host an API redirect lands on: a listing of its own making
            return self._json({"id": "x/y", "sha": "f" * 40, "siblings": []})
        sha = path.removeprefix("/cdn/")
        for r in self.hub.repos.values():
            for f in r.files.values():
                if f.sha256 == sha:
                    return self._body(f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes"}, head_only)
        self._send(404, b"", head_only=head_only)

    def _body(self, f: HubFile, headers: dict[str, str], head_only: bool) -> None:
        start, end = 0, f.size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a) if a else 0
            end = int(b) if b else f.size - 1
            if start >= f.size:
                return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"}, head_only)
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{f.size}"}
        n = end - start + 1
        self._status(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(n))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if head_only:
            return self._done(status)
        if self._hang("body"):
            return self._done(status)
        cut = self.hub.cut_after.pop(f.name, None) if self.command == "GET" else None
        sent = 0
        with open(f.path, "rb") as fh:
            fh.seek(start)
            while sent < n:
                want = min(CHUNK, n - sent)
                if cut is not None:
                    want = min(want, cut - (start + sent)) if cut > start + sent else 0
                if want == 0:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return self._done(status, sent)
                block = fh.read(want)
                if f.name in self.hub.corrupt and start + sent <= f.size // 2 < start + sent + len(block):
                    i = f.size // 2 - start - sent
                    block = block[:i] + bytes([block[i] ^ 0xFF]) + block[i + 1:]
                self.entry.sent = sent + len(block)  # counted before the client can have it
                try:
                    self.wfile.write(block)
                except OSError:
                    self.close_connection = True
                    return self._done(status, sent)
                sent += len(block)
                ob = self.hub.on_bytes
                if ob is not None and ob[0] == f.name and start + sent >= ob[1]:
                    self.hub.on_bytes = None
                    self.wfile.flush()
                    ob[2]()
                if self.hub.throttle:
                    time.sleep(self.hub.throttle)
        self._done(status, sent)
