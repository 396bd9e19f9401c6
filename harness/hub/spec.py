"""What the user asks for (`org/repo`, `org/repo:QUANT`, `org/repo/path/file.gguf`), checked before anything is
fetched, and the quant picked from a repo's file names as the pinned llama.cpp's -hf picks it (common/download.cpp:
find_best_model, get_split_files). Names from the network pass the same checks before they become paths."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import UserError

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf without a tag: the first of these present, else the first GGUF
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_TAG = re.compile(r"[A-Za-z0-9_]{1,32}")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>[0-9]{5})-of-(?P<count>[0-9]{5})$", re.IGNORECASE)
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # GGUFs that are not a model
MAX_NAME = 512


class BadHubName(UserError):
    """A repo id, quant tag or file name that cannot be used (from the user or from the hub)."""


@dataclass(frozen=True)
class HubRef:
    """What to pull: a repo and a quant tag, or a file (the first shard of a split model)."""

    repo: str
    tag: str = ""  # "" with file "": llama.cpp's default
    file: str = ""
    revision: str = "main"

    def __str__(self) -> str:
        return self.repo + (f":{self.tag}" if self.tag else "") + (f"/{self.file}" if self.file else "")


def check_repo(repo: str, what: str = "repo") -> str:
    if not _REPO.fullmatch(repo) or ".." in repo or "--" in repo or repo.endswith((".", "-")):
        raise BadHubName(f"{what} {repo!r} is not a hub repo id: give org/name (letters, digits, '.', '_', '-')")
    return repo


def check_file_name(name: str, what: str = "file") -> str:
    """A repo-relative file name safe to become a path: no absolute path, no '..' or '.' part, no backslash or
    control character. Refused with one line before any path is made from it."""
    parts = name.split("/")
    bad = (not name or len(name) > MAX_NAME or name.startswith("/") or "\\" in name or ":" in name
           or any(p in ("", ".", "..") for p in parts) or not name.isprintable())
    if bad:
        raise BadHubName(f"{what} {name!r} is not a safe file name (no absolute path, '..', '.' or empty part, "
                         "backslash or control character); refused before any path was made")
    return name


def check_revision(rev: str) -> str:
    if not rev or len(rev) > 256 or not rev.isprintable() or ".." in rev or rev.startswith("/"):
        raise BadHubName(f"revision {rev!r} is not a branch, tag or commit name")
    return rev


def parse_ref(text: str, revision: str = "main") -> HubRef:
    """`org/repo`, `org/repo:QUANT` or `org/repo/path/to/file.gguf` (a split model: its first shard)."""
    src = text.strip()
    if src.startswith(("hf://", "https://", "http://")):
        raise BadHubName(f"{text!r}: give org/repo[:QUANT] or org/repo/file.gguf, not a URL (HF_ENDPOINT sets the hub)")
    repo_part, _, tag = src.partition(":")
    parts = repo_part.split("/")
    if len(parts) < 2:
        raise BadHubName(f"{text!r} is not org/repo[:QUANT] or org/repo/file.gguf")
    repo = check_repo("/".join(parts[:2]))
    file = "/".join(parts[2:])
    if file and tag or "/" in tag:
        raise BadHubName(f"{text!r}: give a quant (org/repo:QUANT) or a file (org/repo/file.gguf), not both")
    if file:
        check_file_name(file)
        if not file.lower().endswith(".gguf"):
            raise BadHubName(f"{text!r}: the file must be a .gguf (the first shard of a split model)")
    if tag and not _TAG.fullmatch(tag):
        raise BadHubName(f"quant {tag!r} in {text!r} is not a quant name (letters, digits, '_', e.g. Q4_K_M)")
    return HubRef(repo=repo, tag=tag.upper(), file=file, revision=check_revision(revision))


# ---- picking the file, as llama.cpp's -hf does ---------------------------------------------------------------------

@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # the name without .gguf and without -0000i-of-0000n (the tag included)
    tag: str  # the quant tag in upper case, "" when none
    index: int
    count: int


def split_info(name: str) -> SplitInfo | None:
    """A .gguf name's split prefix, quant tag, shard index and count (None: not a .gguf)."""
    if not name.lower().endswith(".gguf"):
        return None
    prefix, index, count = name[:-5], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m["prefix"], int(m["index"]), int(m["count"])
    t = re.search(r"[-.]([A-Za-z0-9_]+)$", prefix)
    return SplitInfo(prefix, t[1].upper() if t else "", index, count)


def is_model_gguf(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(s in base for s in _SIDECARS)


def _first_shard(name: str) -> bool:
    s = split_info(name)
    return s is not None and (s.count <= 1 or s.index == 1)


def pick_file(names: list[str], tag: str) -> str | None:
    """The model file llama.cpp's -hf would take for `tag` (case-insensitive `TAG[.-]` in the name; no tag: Q4_K_M,
    then Q8_0, then the first model GGUF), always a first shard; None when the tag matches nothing."""
    for t in [tag] if tag else list(DEFAULT_TAGS):
        pat = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for n in names:
            if is_model_gguf(n) and pat.search(n) and _first_shard(n):
                return n
    if not tag:
        return next((n for n in names if is_model_gguf(n) and _first_shard(n)), None)
    return None


def shards_of(names: list[str], first: str) -> list[str]:
    """Every shard of the split model whose first shard is `first`, in order (just `first` when not split); a
    missing shard is refused."""
    s = split_info(first)
    if s is None or s.count <= 1:
        return [first]
    found = {}
    for n in names:
        o = split_info(n)
        if o is not None and o.count == s.count and o.prefix == s.prefix:
            found[o.index] = n
    missing = [i for i in range(1, s.count + 1) if i not in found]
    if missing:
        raise UserError(f"{first}: the repo lacks shard(s) {', '.join(str(i) for i in missing)} of {s.count}; "
                        "a split model needs every shard")
    return [found[i] for i in range(1, s.count + 1)]


def quants_in(names: list[str]) -> list[str]:
    """The quant tags of the repo's model GGUFs, for the message when the one asked for is not there."""
    tags = []
    for n in names:
        s = split_info(n)
        if s is not None and is_model_gguf(n) and s.tag and s.tag not in tags:
            tags.append(s.tag)
    return tags
