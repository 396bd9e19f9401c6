"""Every fault of issue 34 item 3 against the real loopback hub: one line each with its exit status, and nothing
half-written left where a model is taken from (the cache's snapshots): an unknown repo, file or revision, a gated
repo without (or with a wrong) token, a quant the repo lacks, bytes that do not hash to the hub's sha256, too little
space before the first byte and a disk that fills mid-download, a hub that hangs, the file list redirected to
another host, and file names with a path in them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.hub.spec import BadHubName, check_file_name, parse_ref
from tests.helpers.faults import fill, mount_tmpfs
from tests.helpers.hub import REPO, Hub
from tests.helpers.pull import blobs, bmoe, one_error, snapshot_entries


def test_unknown_repo_file_and_revision(hub: Hub, hf_env: Path):
    one_error(bmoe("pull", "org/nothing"), 2, "org/nothing: no such repo", "(404)", "HF_TOKEN")
    one_error(bmoe("pull", f"{REPO}/nothing-Q4_K_M.gguf"), 2, "has no file nothing-Q4_K_M.gguf", "tiny-Q8_0.gguf")
    one_error(bmoe("pull", REPO, "--revision", "v9"), 2, "no such revision")
    assert snapshot_entries(hf_env) == []


def test_a_quant_the_repo_lacks_lists_the_ones_it_has(hub: Hub, hf_env: Path):
    one_error(bmoe("pull", f"{REPO}:IQ2_XS"), 2, "has no IQ2_XS GGUF", "its quants: Q4_K_M, Q8_0")


def test_a_gated_repo_says_how_to_give_a_token(hub: Hub, hf_env: Path, repo_dir: Path, monkeypatch):
    hub.add_repo("org/gated", repo_dir, gated=True)
    one_error(bmoe("pull", "org/gated:Q8_0"), 2, "org/gated is gated (401)", "HF_TOKEN", "huggingface-cli login")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    one_error(bmoe("pull", "org/gated:Q8_0"), 2, "gated (403)")
    assert snapshot_entries(hf_env) == []
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    p = bmoe("pull", "org/gated:Q8_0")
    assert p.returncode == 0, p.stderr
    cdn = [e for e in hub.log if e.server == "cdn"]
    assert cdn and not any(e.auth for e in cdn)  # the token went to the hub, never to its CDN
    assert any(e.auth for e in hub.log if e.server == "hub")


def test_bytes_that_do_not_hash_to_the_hubs_sha256_are_refused_and_removed(hub: Hub, hf_env: Path):
    hub.corrupt.add("tiny-Q8_0.gguf")
    one_error(bmoe("pull", f"{REPO}:Q8_0"), 65, "hash to", "not the hub's", "refused and removed")
    assert snapshot_entries(hf_env) == [] and blobs(hf_env) == []  # no blob, no partial file
    hub.corrupt.clear()
    assert bmoe("pull", f"{REPO}:Q8_0").returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    yield from mount_tmpfs(tmp_path)


def test_too_little_space_is_refused_before_the_first_byte(hub: Hub, hf_env: Path, tmpfs: Path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmpfs / "hf"))  # 3 MiB: the 10 MiB Q8_0 cannot fit
    one_error(bmoe("pull", f"{REPO}:Q8_0"), 28, f"{tmpfs}", "free", "needs")
    assert not [e for e in hub.log if e.method == "GET" and e.server == "cdn"]


def test_a_disk_that_fills_mid_download_names_the_path(hub: Hub, hf_env: Path, tmpfs: Path, tmp_path: Path,
                                                       monkeypatch):
    small = tmp_path / "small"
    small.mkdir()
    (small / "s-Q4_K_M.gguf").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: fits in 3 MiB, until the filler
    hub.add_repo("org/small", small)
    monkeypatch.setenv("HF_HOME", str(tmpfs / "hf"))
    hub.on_bytes = ("s-Q4_K_M.gguf", 1 << 20, lambda: fill(tmpfs))
    line = one_error(bmoe("pull", "org/small"), 28, "no space left", "resumes")
    assert str(tmpfs / "hf" / "hub") in line
    assert snapshot_entries(tmpfs / "hf") == []


def test_a_hub_that_hangs_times_out(hub: Hub, hf_env: Path, monkeypatch):
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    hub.hang.add("api")
    t0 = time.monotonic()
    one_error(bmoe("pull", REPO), 69, "did not answer within 0.5 s", "HF_HUB_ETAG_TIMEOUT")
    assert time.monotonic() - t0 < 5
    hub.hang = {"body"}  # headers sent, then silence
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.3")
    t0 = time.monotonic()
    one_error(bmoe("pull", f"{REPO}:Q8_0"), 69, "HF_HUB_DOWNLOAD_TIMEOUT", "resumes")
    assert time.monotonic() - t0 < 15
    assert snapshot_entries(hf_env) == []


def test_the_file_list_redirected_to_another_host_is_refused(hub: Hub, hf_env: Path):
    hub.api_redirect = f"{hub.cdn_url}/api/models/{REPO}"  # another origin, serving a listing of its own
    one_error(bmoe("pull", REPO), 69, "redirected its file list to another host", "refused")
    assert not [e for e in hub.log if e.server == "cdn"]  # not even asked


def test_the_hubs_redirect_of_a_file_to_its_cdn_is_followed(hub: Hub, hf_env: Path):
    assert bmoe("pull", f"{REPO}:Q8_0").returncode == 0
    heads = [e for e in hub.log if e.method == "HEAD" and "tiny-Q8_0" in e.path]
    assert heads[0].status == 302 and [e.server for e in hub.log if e.method == "GET"][-1] == "cdn"


@pytest.mark.parametrize("name", ["../evil-Q4_K_M.gguf", "/etc/evil-Q4_K_M.gguf", "a/../../evil-Q4_K_M.gguf",
                                  "a\\..\\evil.gguf", "./x.gguf", "a//b.gguf", "nul\x00.gguf"])
def test_a_path_in_a_file_name_is_refused_before_any_path_is_made(name: str):
    with pytest.raises(BadHubName, match="not a safe file name"):
        check_file_name(name)


def test_a_listing_with_unsafe_names_fetches_none_of_them(hub: Hub, hf_env: Path, tmp_path: Path, repo_dir: Path):
    r = hub.add_repo("org/evil", repo_dir)
    r.extra_names += ["../../../evil-Q2_K.gguf", "/tmp/evil-Q2_K.gguf"]
    one_error(bmoe("pull", "org/evil:Q2_K"), 2, "has no Q2_K GGUF")
    one_error(bmoe("pull", "org/evil/../../../evil-Q2_K.gguf"), 2, "not a safe file name", "refused before")
    assert not list(tmp_path.rglob("evil*")) and not Path("/tmp/evil-Q2_K.gguf").exists()
    assert not [e for e in hub.log if "evil-Q2_K" in e.path]


@pytest.mark.parametrize(("argv", "needle"), [
    (["pull", "justaname"], "not org/repo"),
    (["pull", "org/repo:Q4_K_M/x.gguf"], "not both"),
    (["pull", "org/repo/model.bin"], "must be a .gguf"),
    (["pull", "https://huggingface.co/org/repo"], "not a URL"),
    (["pull", "org/re..po"], "not a hub repo id"),
    (["pull", "org/repo:Q4 K"], "not a quant name"),
    (["-hf", "org/repo", "-m", "x.gguf"], "not both"),
    (["-hf"], "needs org/repo"),
])
def test_bad_input_is_one_line_before_the_network(argv: list[str], needle: str, hub: Hub, hf_env: Path):
    one_error(bmoe(*argv), 2, needle)
    assert hub.log == []


def test_the_spec_grammar():
    assert parse_ref("Org/Repo-GGUF:q4_k_m") .tag == "Q4_K_M"
    r = parse_ref("org/repo/sub/dir/m-00001-of-00002.gguf")
    assert (r.repo, r.file, r.tag) == ("org/repo", "sub/dir/m-00001-of-00002.gguf", "")
