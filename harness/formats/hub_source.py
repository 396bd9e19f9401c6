"""Where a campaign's `model: {hf: ...}` came from (manifest provenance, v3): the hub repo, the revision asked, the
commit it resolved to, and each file's sha256 as the hub's LFS metadata gave it and the pull checked it."""

from __future__ import annotations

from harness.formats.record import Record


class HubSource(Record):
    spec: str  # as the campaign wrote it, e.g. org/repo:Q4_K_M
    repo: str
    revision: str  # asked (main unless pinned)
    commit: str  # what it resolved to
    endpoint: str  # HF_ENDPOINT (https://huggingface.co by default)
    files: dict[str, str | None]  # repo-relative file name -> sha256 (None: a small git file, checked by blob id)
