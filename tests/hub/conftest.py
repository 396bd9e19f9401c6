"""What the hub tests share: small GGUFs made by bmoe's writer (a Q4_K_M split in three shards, a Q8_0 in one
file), served by a real loopback hub (tests/helpers/hub.py), and huggingface_hub pointed at it through its own
environment variables (HF_ENDPOINT, a fresh HF_HOME) with no token and short timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.hub import REPO, Hub


@pytest.fixture(scope="session")
def repo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("repo")
    make_model(d / "tiny-Q4_K_M.gguf", ModelSpec(expert_type="q4_k", seed=11, n_split=3))
    make_model(d / "tiny-Q8_0.gguf", ModelSpec(expert_type="q8_0", seed=11))
    (d / "README.md").write_text("a tiny synthetic MoE, for tests\n")
    return d


@pytest.fixture
def hub(repo_dir: Path):
    h = Hub()
    h.add_repo(REPO, repo_dir)
    yield h
    h.close()


@pytest.fixture
def hf_env(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment huggingface_hub reads, for this test: returns HF_HOME."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "sha256.json"))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    return home
