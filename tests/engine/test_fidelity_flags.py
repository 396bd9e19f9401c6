"""The fidelity flags' rules (config/rules.py) and the CLI's checks of a reference before the load: one line each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.engine import cli
from harness.engine.config import parse_cli
from harness.errors import UserError
from harness.formats.fidelity import RefWriter

M = ["-m", "model.gguf"]


@pytest.mark.parametrize("argv, needle", [
    (["--fidelity-csv", "f.csv"], "--fidelity-csv writes the figures of a --fidelity-against run"),
    (["--fidelity-top-k", "8"], "--fidelity-top-k sets what a --fidelity-ref file holds"),
    (["--fidelity-chunks", "2"], "--fidelity-chunks sets what a --fidelity-ref file holds"),
    (["--fidelity-ref", "a", "--fidelity-against", "b"], "give one of them"),
    (["--fidelity-ref", "a", "--csv", "x.csv"], "cannot be combined with --csv"),
    (["--fidelity-against", "a", "--prompts-file", "p"], "cannot be combined with --prompts-file"),
    (["--fidelity-against", "a", "--ngram"], "cannot be combined with --ngram"),
    (["--fidelity-against", "a", "--session"], "cannot be combined with --session"),
    (["--fidelity-against", "a", "--route-ahead", "1"], "--route-ahead changes nothing"),
    (["--fidelity-against", "a", "--moe-stream", "--drop-cold-experts", "0.5"], "add --fidelity-decode"),
    (["--fidelity-decode"], "--fidelity-decode sets how a text is scored"),
    (["--fidelity-against", "a", "--fidelity-decode", "--moe-stream", "--drop-cold-experts", "0.5",
      "--drop-in-prefill"], "--drop-in-prefill would add drops at each chunk's first token only"),
    (["--fidelity-against", "a", "--fidelity-decode", "--moe-stream", "--io-trace", "t"],
     "cannot be combined with --io-trace"),
    (["--fidelity-ref", "a", "--fidelity-top-k", "-1"], "--fidelity-top-k must be >= 0"),
])
def test_refusals(argv, needle):
    with pytest.raises(UserError) as e:
        parse_cli(M + argv)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_accepted():
    cfg = parse_cli(M + ["--fidelity-ref", "r", "--fidelity-top-k", "0", "--fidelity-chunks", "3"])
    assert (cfg.fidelity_ref, cfg.fidelity_top_k, cfg.fidelity_chunks) == ("r", 0, 3)
    cfg = parse_cli(M + ["--fidelity-against", "r", "--fidelity-csv", "f", "--moe-stream", "--drop-cold-experts",
                         "0.5", "--drop-in-prefill"])
    assert cfg.fidelity_csv == "f"
    # one token at a time: the decode-time knobs are scored as they act in generation, and routes can be traced
    cfg = parse_cli(M + ["--fidelity-against", "r", "--fidelity-decode", "--moe-stream", "--drop-cold-experts", "0.5",
                         "--route-trace", "t.csv"])
    assert cfg.fidelity_decode and cfg.route_trace == "t.csv"
    assert parse_cli(M + ["--fidelity-ref", "r", "--fidelity-decode", "--route-ahead", "1"]).route_ahead == 1


def _ref(path: Path, ctx: int = 32) -> None:
    w = RefWriter(path, {"n_vocab": 10, "ctx": ctx, "first": ctx // 2, "n_chunk": 0, "top_k": 2, "bos": -1},
                  np.zeros((0, ctx), np.int32))
    w.close()


def test_cli_checks_the_reference_before_the_load(tmp_path: Path, capsys):
    bad = tmp_path / "bad.ref"
    bad.write_text("not a reference\n")
    assert cli.main(M + ["--fidelity-against", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a bmoe_fidelity_ref file" in err and err.count("\n") == 1
    good = tmp_path / "r.ref"
    _ref(good, ctx=32)
    assert cli.main(M + ["--fidelity-against", str(good), "-c", "64"]) == 2
    assert "was scored with -c 32; drop -c 64" in capsys.readouterr().err
    assert cli.main(["chat", *M, "--fidelity-ref", str(tmp_path / "o.ref")]) == 2
    assert "drop them from bmoe chat" in capsys.readouterr().err
