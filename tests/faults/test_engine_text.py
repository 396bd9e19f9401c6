"""Text split over tokens: a vocabulary of byte tokens only (the generator's bytes-and-specials vocabulary) spells
every non-ASCII character as 2-4 tokens, and this model's greedy reply has such characters. `--progress` lines and
the `--session` token events decode incrementally: their texts joined are the plain run's stdout decoded whole, with
no U+FFFD that decode does not have (before, each progress line decoded its token alone: 2-4 U+FFFD per character)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.formats.progress import parse_progress
from harness.synth import ModelSpec, make_model
from harness.synth.spec import min_vocab
from tests.helpers.engine import BMOE
from tests.helpers.session import SessionProc

pytestmark = pytest.mark.engine

PROMPT = "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e"
N = 64


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = ModelSpec(expert_type="q8_0", seed=1, n_vocab=min_vocab("qwen3moe"))  # byte tokens + specials only
    return make_model(tmp_path_factory.mktemp("bytes") / "b.gguf", spec)[0]


def _bmoe(model: Path, *flags: str) -> bytes:
    p = subprocess.run([*BMOE, "-m", str(model), "-p", PROMPT, "-n", str(N), "-t", "1", *flags], capture_output=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout


@pytest.fixture(scope="module")
def whole(model) -> str:
    """The plain run's stdout (raw bytes, a newline at the end) decoded whole."""
    text = _bmoe(model).removesuffix(b"\n").decode("utf-8", "replace")
    split = [c for c in text if ord(c) > 127 and c != "\ufffd"]
    assert len(split) >= 2, f"the reply has no character spelled over several byte tokens: {text!r}"
    return text


@pytest.mark.parametrize("stream", [False, True])
def test_progress_texts_joined_are_the_output_decoded_whole(model, whole, stream):
    out = _bmoe(model, "--progress", *(("--moe-stream", "--cache-mb", "0") if stream else ()))
    lines = [parse_progress(x) for x in out.decode("utf-8").splitlines()]
    assert len(lines) == N and all(d is not None for d in lines)
    assert [d["step"] for d in lines] == list(range(1, N + 1))  # one line per token, in order
    assert "".join(d["text"] for d in lines) == whole


def test_session_token_events_joined_are_the_output_decoded_whole(model, whole):
    s = SessionProc(model)
    try:
        s.send({"cmd": "generate", "id": 1, "prompt": PROMPT, "n_predict": N})
        events, done = s.until("done", "error")
        assert done["event"] == "done", done
        tokens = [e for e in events if e["event"] == "token"]
        joined = "".join(e["text"] for e in tokens)
        assert len(tokens) == N and done["text"] == whole
        assert joined in (whole, whole.removesuffix("\ufffd"))  # done adds the U+FFFD of a cut-off last character
    finally:
        assert s.close() == 0


def test_the_reply_really_splits_characters_over_tokens(model, whole):
    """The check above means something: decoding each token alone gives U+FFFD the whole decode has not."""
    from gguf import GGUFReader

    r = GGUFReader(model)
    f = r.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(f.parts[i]).decode() for i in f.data]
    s = SessionProc(model)
    try:
        s.send({"cmd": "generate", "id": 1, "prompt": PROMPT, "n_predict": N})
        done = s.until("done", "error")[1]
    finally:
        s.close()
    assert all(vocab[t].startswith("<0x") for t in done["token_ids"])  # every token one byte
    pieces = [bytes([int(vocab[t][3:5], 16)]) for t in done["token_ids"]]
    alone = "".join(p.decode("utf-8", "replace") for p in pieces)
    assert alone.count("\ufffd") > whole.count("\ufffd")


@pytest.mark.parametrize("cut", [False, True])
def test_progress_lines_of_a_reply_split_and_cut_inside_a_character(cut):
    """The text sink alone: '日' (3 bytes) over three tokens, then 'é' cut after its first byte at the end: one line
    per token, in order; the character whole in the line of the token that completes it; a reply that ends inside a
    character ends with the U+FFFD the whole decode has."""
    import io

    from harness.engine.run.sinks import TextSink
    from harness.formats.metrics_csv import Summary, TokenRow

    raw = [b"a", b"\xe6", b"\x97", b"\xa5", b"b"] + ([b"\xc3"] if cut else [])
    out = io.StringIO()
    sink = TextSink(out, progress=True)
    for i, piece in enumerate(raw):
        sink.row(TokenRow(step=i + 1, steps=len(raw), wall_ms=1.0), piece.decode("utf-8", "surrogateescape"))
    sink.finish(Summary())
    lines = [parse_progress(x) for x in out.getvalue().splitlines()]
    assert [d["step"] for d in lines] == list(range(1, len(raw) + 1))
    assert [d["text"] for d in lines] == ["a", "", "", "\u65e5", "b"] + (["\ufffd"] if cut else [])
    assert "".join(d["text"] for d in lines) == b"".join(raw).decode("utf-8", "replace")
