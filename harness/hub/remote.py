"""The hub's answers, through huggingface_hub: where it is and how to reach it (HubSettings, from the environment
huggingface_hub reads), the repo's files at a commit with their sizes and hashes, and every failure turned into one
line naming the repo and what to do.

The repo listing is asked without following a redirect to another host: huggingface_hub follows a metadata redirect
only to the same host or a hub host (its HEAD of a file), and the listing gets the same rule here, so the hashes every
file is checked against come from the endpoint the user named. A file's bytes may come from elsewhere (the hub sends
them from its CDN): their hash is checked against that listing.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin, urlparse

from harness.errors import ResourceError, UserError
from harness.formats.files import DiskFull
from harness.hub.spec import BadHubName, check_file_name

TOKEN_HOW = "give a token: HF_TOKEN=hf_... or `huggingface-cli login`"
MAX_FILE_BYTES = 1 << 46  # 64 TiB: a size above this from the network is refused, not looped over
MAX_FILES = 100_000


class HubUnavailable(ResourceError):
    """The hub could not be reached or did not answer in time (retry later: a download resumes)."""

    exit_code = 69  # EX_UNAVAILABLE


class BadDownload(ResourceError):
    """What the hub sent does not match what it said it would send (hash, size): refused and removed."""

    exit_code = 65  # EX_DATAERR


def _true(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "on", "yes", "true")


@dataclass(frozen=True)
class HubSettings:
    endpoint: str
    cache_dir: Path
    offline: bool
    etag_timeout: float  # metadata requests (the listing, each file's HEAD)
    download_timeout: float  # between bytes of a download (HF_HUB_DOWNLOAD_TIMEOUT)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HubSettings:
        """The variables huggingface_hub reads, read now (its own constants are read once, at its import)."""
        from huggingface_hub import constants

        if env.get("HF_HUB_CACHE"):
            cache = Path(env["HF_HUB_CACHE"])
        elif env.get("HF_HOME"):
            cache = Path(env["HF_HOME"]) / "hub"
        else:
            cache = Path(constants.HF_HUB_CACHE)
        endpoint = (env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        if urlparse(endpoint).scheme not in ("http", "https") or not urlparse(endpoint).hostname:
            raise UserError(f"HF_ENDPOINT={endpoint!r} is not an http(s) URL")
        return cls(endpoint=endpoint, cache_dir=cache.expanduser(),
                   offline=_true(env.get("HF_HUB_OFFLINE")) or _true(env.get("TRANSFORMERS_OFFLINE")),
                   etag_timeout=_seconds(env, "HF_HUB_ETAG_TIMEOUT", constants.DEFAULT_ETAG_TIMEOUT),
                   download_timeout=_seconds(env, "HF_HUB_DOWNLOAD_TIMEOUT", constants.DEFAULT_DOWNLOAD_TIMEOUT))


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    v = env.get(name)
    if not v:
        return float(default)
    try:
        s = float(v)
    except ValueError:
        raise UserError(f"{name}={v!r} is not a number of seconds") from None
    if not 0 < s <= 3600:
        raise UserError(f"{name}={v!r}: give 0 < seconds <= 3600")
    return s


@dataclass(frozen=True)
class RemoteFile:
    name: str  # repo-relative, checked (spec.check_file_name) before use as a path
    size: int
    sha256: str | None  # LFS files: the hub's sha256 of the content
    blob_id: str | None  # the git blob id (sha1 over "blob <size>\\0" + content): what a non-LFS file is checked by


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str  # the revision resolved to its commit sha
    files: dict[str, RemoteFile]  # in the hub's order
    skipped: tuple[str, ...] = ()  # names refused as paths (never fetched)


def _hex(v: object, n: tuple[int, ...]) -> str | None:
    if isinstance(v, str) and len(v) in n and all(c in "0123456789abcdef" for c in v):
        return v
    return None


def listing(s: HubSettings, repo: str, revision: str) -> RepoListing:
    """The repo's files at `revision` (model info with the files' metadata, as HfApi.model_info(files_metadata=True)
    asks it), from the endpoint itself; every field checked before use (names, sizes, hashes)."""
    suffix = "" if revision == "main" else f"/revision/{quote(revision, safe='')}"
    url = f"{s.endpoint}/api/models/{repo}{suffix}"
    with hub_errors(s, repo):
        info = _get_json(s, url, {"blobs": "true"})
    commit = _hex(info.get("sha"), (40,))
    if commit is None:
        raise BadDownload(f"{repo}: the hub at {s.endpoint} gave no commit sha for revision {revision}; is "
                          "HF_ENDPOINT a hub?")
    siblings = info.get("siblings")
    files: dict[str, RemoteFile] = {}
    skipped = []
    for sib in (siblings if isinstance(siblings, list) else [])[:MAX_FILES]:
        name = sib.get("rfilename") if isinstance(sib, dict) else None
        try:
            check_file_name(name if isinstance(name, str) else "", f"{repo}: the hub's file")
        except BadHubName:
            skipped.append(str(name)[:200])
            continue
        lfs = sib.get("lfs") if isinstance(sib.get("lfs"), dict) else None
        size = (lfs or sib).get("size")
        if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
            skipped.append(name)
            continue
        files[name] = RemoteFile(name, size, _hex(lfs.get("sha256"), (64,)) if lfs else None,
                                 _hex(sib.get("blobId"), (40,)))
    return RepoListing(repo, commit, files, tuple(skipped))


def _get_json(s: HubSettings, url: str, params: dict[str, str]) -> dict:
    """GET a hub API URL with huggingface_hub's session, headers and error types, following a redirect only on the
    same host (the hub's renamed-repo redirect); another host is refused."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers()
    for _ in range(5):
        r = get_session().get(url, params=params, headers=headers, timeout=s.etag_timeout, follow_redirects=False)
        hf_raise_for_status(r)
        if not r.has_redirect_location:
            try:
                obj = r.json()
            except ValueError:
                raise BadDownload(f"{url}: the hub's answer is not JSON; is HF_ENDPOINT={s.endpoint} a hub?") from None
            if not isinstance(obj, dict):
                raise BadDownload(f"{url}: the hub's answer is not a repo description")
            return obj
        target = urljoin(url, r.headers["Location"])
        if _origin(target) != _origin(url):
            raise HubUnavailable(f"{url}: the hub redirected its file list to another host ({_origin(target)[1]}); "
                                 "refused: the hashes files are checked against must come from HF_ENDPOINT itself")
        url, params = target, {}
    raise HubUnavailable(f"{url}: too many redirects")


def _origin(url: str) -> tuple[str, str, int]:
    p = urlparse(url)
    return (p.scheme, (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(p.scheme, 0))


@contextlib.contextmanager
def hub_errors(s: HubSettings, repo: str, file: str = "", path: Path | None = None) -> Iterator[None]:
    """huggingface_hub's and the network's failures as one line each (the original chained, for BMOE_DEBUG)."""
    import httpx2
    from huggingface_hub import errors as he

    what = f"{repo}/{file}" if file else repo
    try:
        yield
    except he.GatedRepoError as e:
        code = e.response.status_code if e.response is not None else "401"
        raise UserError(f"{repo} is gated ({code}): accept its terms on the hub's page with your account, then "
                        f"{TOKEN_HOW}") from None
    except he.RepositoryNotFoundError as e:
        code = e.response.status_code if e.response is not None else 404
        raise UserError(f"{repo}: no such repo on {s.endpoint} ({code}); check the name, or if it is private "
                        f"{TOKEN_HOW}") from None
    except he.RevisionNotFoundError:
        raise UserError(f"{repo}: no such revision on {s.endpoint} (404); give a branch, tag or commit it "
                        "has") from None
    except he.RemoteEntryNotFoundError:
        raise UserError(f"{what}: the hub has no such file (404) though its listing names it; pull again") from None
    except he.HfHubHTTPError as e:
        code = e.response.status_code if e.response is not None else "?"
        if code in (401, 403):
            raise UserError(f"{what}: the hub refused access ({code}); {TOKEN_HOW} with read access to it") from None
        raise HubUnavailable(f"{what}: the hub at {s.endpoint} answered {code}; retry later") from None
    except httpx2.TimeoutException:
        raise HubUnavailable(f"{what}: the hub at {s.endpoint} did not answer within {s.etag_timeout:g} s (metadata, "
                             f"HF_HUB_ETAG_TIMEOUT) / {s.download_timeout:g} s (data, HF_HUB_DOWNLOAD_TIMEOUT); retry "
                             "later: the download resumes where it stopped") from None
    except (httpx2.TransportError, httpx2.TooManyRedirects) as e:
        raise HubUnavailable(f"{what}: cannot reach the hub at {s.endpoint} ({type(e).__name__}: {e}); check the "
                             "network and HF_ENDPOINT, or HF_HUB_OFFLINE=1 to use what is cached") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            where = path or s.cache_dir
            raise DiskFull(f"{where}: no space left on the device while downloading {what}; free space there (or "
                           "set HF_HUB_CACHE elsewhere) and pull again: the download resumes") from None
        if "Consistency check failed" in str(e):  # http_get: the connection ended before the file did
            raise HubUnavailable(f"{what}: the hub ended the download early; pull again: it resumes") from None
        if e.filename is not None:
            raise UserError(f"{e.filename}: {e.strerror}; the hub's cache must be writable (HF_HOME, HF_HUB_CACHE)") \
                from None
        raise

