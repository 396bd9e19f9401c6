"""Guess-ahead by prompt lookup (--ngram): the guess itself (pure), the flag rules, and the gates on generated
models: --ngram --draft N gives the tokens plain greedy decoding gives, streamed (a cache that evicts, and
none) and resident, with guesses kept and with guesses all rejected; one wrong expert still diverges; the
session protocol guesses ahead too and refuses a sampled request with one line. llama.cpp's CPU kernels are not
batch-size invariant (a token's logits differ by up to ~0.1 decoded alone or in a verify batch with quantized
experts), so "equals plain greedy" holds where no near-tie meets that rounding: on these models and prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.engine.guess.ngram import ngram_guess, split_int
from harness.engine.serve.turns import sampling_of
from harness.errors import UserError
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe
from tests.helpers.session import assert_session_drafts_like_plain

N = 32
REPEAT = "1 2 3 1 2 3 1 2 3 1 2 3 1 2 3"  # guesses are made, some kept
MONOTONE = "a a a a a a a a a a a a a a a a"  # guesses are made, none kept (on the f32 model)


# -- the guess ----------------------------------------------------------------------------------------------


def test_guess_continues_the_latest_earlier_occurrence():
    h = [1, 2, 9, 8, 1, 2, 7, 6, 5, 1, 2]
    assert ngram_guess(h, 2, 3) == [7, 6, 5]  # the latest occurrence of [1, 2], not the first
    assert ngram_guess(h, 3, 3) == []  # [5, 1, 2] occurs nowhere earlier
    assert ngram_guess(h, 2, 0) == []


def test_guess_wraps_a_loop_shorter_than_the_guess():
    assert ngram_guess([4, 5, 4, 5], 2, 5) == [4, 5, 4, 5, 4]
    assert ngram_guess([3, 3], 1, 4) == [3, 3, 3, 3]


def test_guess_stops_before_an_end_of_generation_token():
    assert ngram_guess([1, 2, 0, 4, 1, 2], 2, 4, stop=lambda t: t == 0) == []
    assert ngram_guess([1, 2, 5, 0, 1, 2], 2, 4, stop=lambda t: t == 0) == [5]


def test_split_int_sums_exactly():
    assert split_int(10, 3) == [4, 3, 3] and sum(split_int(7, 7)) == 7 and split_int(5, 1) == [5]


@pytest.mark.parametrize("argv, msg", [
    (["--ngram", "--temp", "0.7"], "greedy"),
    (["--draft", "2"], "add --ngram"),
    (["--ngram-size", "2"], "add --ngram"),
    (["--ngram", "--moe-stream", "--route-trace", "t.csv"], "cannot be combined with --ngram"),
    (["--ngram", "--route-replay", "t.csv"], "cannot be combined with --ngram"),
    (["--ngram", "--draft", "0"], "--draft must be"),
])
def test_flag_rules(argv, msg):
    with pytest.raises(UserError, match=msg):
        parse_cli(["-m", "x.gguf", *argv])


def test_a_sampled_request_is_refused_by_a_guessing_engine():
    """The session protocol, the terminal chat and the server all take their sampling through sampling_of."""
    cfg = parse_cli(["-m", "x.gguf", "--ngram"])
    assert sampling_of(cfg, temp=0.0).temp == 0.0
    with pytest.raises(UserError, match="greedy only"):
        sampling_of(cfg, temp=0.8)


# -- the gates ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("guess")
    return {"q4_k": make_model(d / "q4_k.gguf", ModelSpec(expert_type="q4_k", seed=1))[0],
            "f32": make_model(d / "f32.gguf", ModelSpec(expert_type="f32", seed=3))[0]}


@pytest.fixture(scope="module")
def plain(models, tmp_path_factory):
    """Plain greedy decoding (resident, no guesses): the reference, once per model and prompt."""
    d = tmp_path_factory.mktemp("plain")
    got: dict[tuple[str, str], list[int]] = {}

    def get(name: str, prompt: str) -> list[int]:
        if (name, prompt) not in got:
            r = _run(models, d, name, prompt)
            assert len(r.tokens) == N and len(set(r.tokens)) > N // 4, r.tokens
            got[name, prompt] = r.tokens
        return got[name, prompt]

    return get


def _run(models, tmp, name, prompt, *flags, env=None):
    r = bmoe(models[name], "-c", "256", *flags, n=N, tmp=tmp, prompt=prompt, env=env)
    assert r.rc == 0, r.stderr
    return r


STREAMS = {"resident": (), "evicting": ("--moe-stream", "--cache-mb", "1"),
           "no-cache": ("--moe-stream", "--cache-mb", "0")}


@pytest.mark.engine
@pytest.mark.parametrize("draft", ["2", "4"])
def test_ngram_equals_plain_greedy_with_guesses_kept(models, plain, tmp_path, draft):
    ref = plain("q4_k", REPEAT)
    for how, flags in STREAMS.items():
        r = _run(models, tmp_path, "q4_k", REPEAT, "--ngram", "--draft", draft, "--ngram-size", "1", *flags)
        assert r.tokens == ref, how
        s = r.summary
        assert 0 < s["draft_accepted"] < s["draft_proposed"], (how, s)
        assert s["n_decode"] == N and r.preamble["cfg.ngram"] == "True"
        if how == "evicting":
            assert s["evictions"] > 0
        if how != "resident":
            assert s["mib_read_per_token"] > 0


@pytest.mark.engine
def test_ngram_equals_plain_greedy_with_every_guess_rejected(models, plain, tmp_path):
    ref = plain("f32", MONOTONE)
    streams = dict(STREAMS, evicting=("--moe-stream", "--cache-mb", "8"))  # T = 6 MiB here; 25 MiB of experts
    for how, flags in streams.items():
        r = _run(models, tmp_path, "f32", MONOTONE, "--ngram", "--draft", "4", "--ngram-size", "1", *flags)
        assert r.tokens == ref, how
        assert r.summary["draft_proposed"] > 0 and r.summary["draft_accepted"] == 0, how
        if how == "evicting":
            assert r.summary["evictions"] > 0


@pytest.mark.engine
def test_rows_of_a_verify_batch_share_its_time_and_reads(models, tmp_path):
    from harness.formats.metrics_csv import read_metrics

    r = _run(models, tmp_path, "q4_k", REPEAT, "--ngram", "--draft", "4", "--ngram-size", "1", *STREAMS["evicting"])
    m = read_metrics(next(tmp_path.glob("run-*.csv")))
    rows = m.rows
    assert list(rows["step"]) == list(range(1, N + 1))  # one row per emitted token
    assert int(rows["draft_proposed"].sum()) == r.summary["draft_proposed"]
    assert int(rows["draft_accepted"].sum()) == r.summary["draft_accepted"]
    assert round(rows["read_bytes"].sum() / 1048576 / N, 4) == r.summary["mib_read_per_token"]
    i = int(rows.index[rows["draft_accepted"] > 0][0])  # a batch that kept guesses: its rows share its wall
    kept = int(rows["draft_accepted"][i])
    assert rows["wall_ms"][i:i + kept + 1].nunique() == 1


@pytest.mark.engine
def test_one_wrong_expert_still_diverges_with_ngram(models, tmp_path):
    from harness.formats.route_trace import DECODE, read_route_trace

    trace = tmp_path / "t.route.csv"
    _run(models, tmp_path, "q4_k", REPEAT, "--moe-stream", "--cache-mb", "0", "--route-trace", str(trace))
    expert = next(r.expert for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == 1)
    flags = ("--ngram", "--draft", "4", "--ngram-size", "1", "--moe-stream", "--cache-mb", "0")
    good = _run(models, tmp_path, "q4_k", REPEAT, *flags)
    wrong = {"BMOE_TEST_WRONG_EXPERT": f"1,{expert},{(expert + 1) % 8}"}
    bad = _run(models, tmp_path, "q4_k", REPEAT, *flags, env=wrong)
    assert bad.tokens != good.tokens


@pytest.mark.engine
def test_session_guesses_ahead_and_refuses_a_sampled_request(models):
    assert_session_drafts_like_plain(models["q4_k"], "--ngram", "--draft", "4", "--ngram-size", "1")


@pytest.mark.engine
def test_a_recurrent_model_is_refused_with_one_line(tmp_path):
    """qwen35moe's gated delta net keeps a recurrent state: rejected guesses could not be removed from it."""
    m = make_model(tmp_path / "q35.gguf", ModelSpec(arch="qwen35moe", seed=5))[0]
    r = bmoe(m, "--ngram", n=4, tmp=tmp_path)
    assert r.rc != 0
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "recurrent state" in err[0] and "drop --ngram" in err[0], r.stderr
