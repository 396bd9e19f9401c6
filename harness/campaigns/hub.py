"""A campaign's `model: {hf: org/repo[:QUANT]}`: pulled into the local hub cache as `bmoe pull` does (every shard,
each file's sha256 checked), then given to the target: a local run uses the cache's own files (a split model's shards
side by side, as llama.cpp finds them), adb and ssh get every shard staged as push_from stages a file. What it
resolved to (repo, commit, each file's sha256) goes into the manifest's provenance."""

from __future__ import annotations

import os

from rich.console import Console

from harness.formats.hub_source import HubSource
from harness.formats.manifest import ModelDesc
from harness.targets.base import Target


def pull_model(spec: str, target: Target, console: Console) -> tuple[str, ModelDesc, HubSource]:
    """(the model's path on the target, its description, its provenance)."""
    from harness.hub.command import pull_ref
    from harness.hub.remote import HubSettings

    console.print(f"model: pulling (or finding in the hub cache) {spec}")
    got = pull_ref(spec, "main", os.environ, console.file)
    if target.kind == "local":
        model = str(got.path)
    else:
        model = [target.stage(f.path, "model") for f in got.files][0]
    desc = ModelDesc(hf=spec, file=str(got.path), bytes=sum(f.size for f in got.files),
                     **({"path": model} if target.kind != "local" else {}))
    src = HubSource(spec=spec, repo=got.repo, revision=got.revision, commit=got.commit,
                    endpoint=HubSettings.from_env(os.environ).endpoint, files={f.name: f.sha256 for f in got.files})
    return model, desc, src
