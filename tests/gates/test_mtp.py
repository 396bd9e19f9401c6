"""Guess-ahead with the model's own MTP (nextn) head (--mtp): the flag rules, and the gates on generated glm4moe
models (they have one nextn layer): --mtp --draft N gives the tokens plain greedy decoding gives, streamed (a
cache that evicts, and none) and resident, with drafts kept and rejected (a random head's drafts are all
rejected; the `mtp_bigram` head's are often kept, see harness.synth.archs._parts.nextn_block); one wrong expert
still diverges; the session protocol drafts too; a model without a nextn layer is refused with one line. As
with --ngram, llama.cpp's CPU kernels are not batch-size invariant, so "equals plain greedy" holds where no
near-tie meets that rounding: on these models and prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.engine.serve.turns import sampling_of
from harness.errors import UserError
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe
from tests.helpers.session import assert_session_drafts_like_plain

N = 32
PROMPT = "1 2 3 1 2 3 1 2 3"


@pytest.mark.parametrize("argv, msg", [
    (["--mtp", "--temp", "0.7"], "--mtp verifies its guesses against greedy decoding: drop --temp"),
    (["--mtp", "--ngram"], "use one of them"),
    (["--mtp", "--ngram-size", "2"], "add --ngram"),
    (["--draft", "2"], "add --ngram or --mtp"),
    (["--mtp", "--moe-stream", "--route-trace", "t.csv"], "cannot be combined with --mtp"),
    (["--mtp", "--route-replay", "t.csv"], "cannot be combined with --mtp"),
    (["--mtp", "--moe-stream", "--cache-mb", "8", "--prefetch", "1"], "--prefetch with --mtp is not supported"),
    (["--mtp", "--draft", "0"], "--draft must be"),
])
def test_flag_rules(argv, msg):
    with pytest.raises(UserError, match=msg):
        parse_cli(["-m", "x.gguf", *argv])


def test_mtp_takes_draft_and_is_lossless_like_ngram():
    from harness.engine.config import lossy_settings

    cfg = parse_cli(["-m", "x.gguf", "--mtp", "--draft", "2"])
    assert cfg.mtp and cfg.draft == 2
    assert not [s for s in lossy_settings(cfg) if s.startswith(("--mtp", "--ngram"))]
    with pytest.raises(UserError, match="--draft"):
        parse_cli(["-m", "x.gguf", "--mtp", "--draft", "7"])
    assert sampling_of(cfg, temp=0.0).temp == 0.0
    with pytest.raises(UserError, match="greedy only"):
        sampling_of(cfg, temp=0.8)


# -- the gates ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mtp")
    shape = dict(arch="glm4moe", n_expert=32, n_expert_used=4)  # 17 MiB of experts: a 1 MiB cache evicts
    return {"kept": make_model(d / "kept.gguf", ModelSpec(**shape, arch_params=(("mtp_bigram", 10),)))[0],
            "random": make_model(d / "random.gguf", ModelSpec(**shape, seed=2))[0]}


@pytest.fixture(scope="module")
def plain(models, tmp_path_factory):
    """Plain greedy decoding (resident, no drafts): the reference, once per model."""
    d = tmp_path_factory.mktemp("plain")
    got: dict[str, list[int]] = {}

    def get(name: str) -> list[int]:
        if name not in got:
            r = _run(models, d, name)
            assert len(r.tokens) == N and len(set(r.tokens)) > N // 4, r.tokens
            got[name] = r.tokens
        return got[name]

    return get


def _run(models, tmp, name, *flags, env=None):
    r = bmoe(models[name], "-c", "256", *flags, n=N, tmp=tmp, prompt=PROMPT, env=env)
    assert r.rc == 0, r.stderr
    return r


STREAMS = {"resident": (), "evicting": ("--moe-stream", "--cache-mb", "1"),
           "no-cache": ("--moe-stream", "--cache-mb", "0")}


@pytest.mark.engine
@pytest.mark.parametrize("draft", ["1", "3"])
def test_mtp_equals_plain_greedy_with_drafts_kept(models, plain, tmp_path, draft):
    ref = plain("kept")
    for how, flags in STREAMS.items():
        r = _run(models, tmp_path, "kept", "--mtp", "--draft", draft, *flags)
        assert r.tokens == ref, how
        s = r.summary
        assert 0 < s["draft_accepted"] < s["draft_proposed"], (how, s)
        assert s["n_decode"] == N and r.preamble["cfg.mtp"] == "True"
        if how == "evicting":
            assert s["evictions"] > 0
        if how != "resident":
            assert s["mib_read_per_token"] > 0


@pytest.mark.engine
def test_mtp_equals_plain_greedy_with_every_draft_rejected(models, plain, tmp_path):
    ref = plain("random")
    for how, flags in STREAMS.items():
        r = _run(models, tmp_path, "random", "--mtp", "--draft", "3", *flags)
        assert r.tokens == ref, how
        assert r.summary["draft_proposed"] > 0 and r.summary["draft_accepted"] == 0, how
        if how == "evicting":
            assert r.summary["evictions"] > 0


@pytest.mark.engine
def test_one_wrong_expert_still_diverges_with_mtp(models, tmp_path):
    """On the random head's model: the bigram head's trunk hardly depends on its experts (its embedding is ten
    times larger), and the draft's fate does not matter here, the experts read for the verify batch do."""
    from harness.formats.route_trace import DECODE, read_route_trace

    trace = tmp_path / "t.route.csv"
    _run(models, tmp_path, "random", "--moe-stream", "--cache-mb", "0", "--route-trace", str(trace))
    expert = next(r.expert for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == 1)
    flags = ("--mtp", "--draft", "3", "--moe-stream", "--cache-mb", "0")
    good = _run(models, tmp_path, "random", *flags)
    wrong = {"BMOE_TEST_WRONG_EXPERT": f"1,{expert},{(expert + 1) % 32}"}
    bad = _run(models, tmp_path, "random", *flags, env=wrong)
    assert good.summary["draft_proposed"] > 0
    assert bad.tokens != good.tokens


@pytest.mark.engine
def test_session_drafts_ahead_and_refuses_a_sampled_request(models):
    assert_session_drafts_like_plain(models["kept"], "--mtp", "--draft", "3")


@pytest.mark.engine
def test_prompts_file_drafts_every_turn_from_a_cleared_cache(models, tmp_path):
    """--prompts-file clears the KV cache between prompts: the MTP cache follows (its positions are re-found by
    token), and every turn equals its plain turn."""
    from harness.formats.metrics_csv import read_metrics
    from harness.formats.replies import PromptItem, write_prompts

    pf = tmp_path / "prompts.jsonl"
    write_prompts(pf, [PromptItem(id=f"q{i}", prompt=t) for i, t in enumerate([PROMPT, "3 2 1 3 2 1", PROMPT])])
    turns = {}
    for how, flags in (("plain", ()), ("mtp", ("--mtp", "--draft", "3", "--moe-stream", "--cache-mb", "1"))):
        r = bmoe(models["kept"], "-c", "256", "--prompts-file", str(pf), *flags, n=16, tmp=tmp_path)
        assert r.rc == 0, r.stderr
        m = read_metrics(r.csv)
        turns[how] = [[int(x) for x in g["token_id"]] for _, g in m.rows.groupby("turn", sort=True)]
        if how == "mtp":
            assert all(int(g["draft_accepted"].sum()) > 0 for _, g in m.rows.groupby("turn")), how
    assert len(turns["plain"]) == 3 and turns["mtp"] == turns["plain"]


@pytest.mark.engine
def test_a_model_without_a_nextn_layer_is_refused_with_one_line(tmp_path):
    m = make_model(tmp_path / "q3.gguf", ModelSpec(seed=5))[0]
    r = bmoe(m, "--mtp", n=4, tmp=tmp_path)
    assert r.rc != 0
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "no nextn (MTP) layer" in err[0] and "drop --mtp" in err[0], r.stderr


@pytest.mark.engine
def test_a_recurrent_model_is_refused_with_one_line(tmp_path):
    """qwen35moe has an MTP block, but its gated delta net keeps a recurrent state: rejected drafts could not be
    removed from it."""
    m = make_model(tmp_path / "q35.gguf", ModelSpec(arch="qwen35moe", seed=5))[0]
    r = bmoe(m, "--mtp", n=4, tmp=tmp_path)
    assert r.rc != 0
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "recurrent state" in err[0] and "drop --mtp" in err[0], r.stderr
