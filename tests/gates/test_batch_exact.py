"""A verify batch is bit-exact against one-token decoding (issue 13 item 5: --ngram and --mtp lossless).

scripts/batch_exact.py greedy-decodes a continuation one token at a time, then decodes each window of n
positions again in one batch after the same prefix and compares every logit bit for bit, resident and streamed.
These tests fail on a llama.cpp built with llamafile's sgemm (GGML_LLAMAFILE, llama.cpp's default on x86):
its tinyBLAS takes every matmul of two or more columns (a batch) and sums each dot product in another order
than ggml_vec_dot, which takes the one-column matmul of a single-token decode; scripts/setup.sh builds with
-DGGML_LLAMAFILE=OFF. The longest verify batch (--draft 6: 7 rows, one under the K-quant tiled matmul's
threshold) and a KV cache past 512 cells (where flash attention would split a one-token decode's KV over the
threads; the engine's contexts have it off) are compared too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.engine.config import parse_cli
from harness.engine.diag.batch_exact import Node, first_difference, token_row
from harness.engine.guess.exactness import MAX_DRAFT, TILED_MIN_ROWS, batch_inexact_reason
from harness.errors import UserError
from harness.synth import ModelSpec, make_model

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "batch_exact.py"
PROMPTS = ["1 2 3 1 2 3 1 2 3 1 2 3 1 2 3", "The expert cache keeps hot experts near."]


def _node(name: str, ne: tuple[int, ...], data: np.ndarray) -> Node:
    return Node(name, "MUL_MAT", "f32", ne, (), data)


def test_token_row_takes_the_batch_column_of_the_token():
    batch = _node("x", (4, 3, 1, 1), np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4))
    single = _node("x", (4, 1, 1, 1), np.arange(4, 8, dtype=np.float32).reshape(1, 1, 1, 4))
    a, b = token_row(single, batch, 1, 3)
    assert a.tobytes() == b.tobytes()
    assert token_row(_node("x", (4, 2, 1, 1), np.zeros((1, 1, 2, 4), np.float32)), batch, 0, 3) is None


def test_first_difference_names_the_first_node_that_differs():
    def graph(v: float) -> list[Node]:
        return [_node("a", (2, 1, 1, 1), np.zeros((1, 1, 1, 2), np.float32)),
                _node("b", (2, 1, 1, 1), np.full((1, 1, 1, 2), v, np.float32))]

    batch = [_node("a", (2, 2, 1, 1), np.zeros((1, 1, 2, 2), np.float32)),
             _node("b", (2, 2, 1, 1), np.array([[[[1, 1], [2, 2.5]]]], np.float32))]
    hit = first_difference([graph(1.0), graph(2.0)], batch)
    assert hit is not None and hit[1].name == "b" and hit[2] == 1 and hit[3] == 0.5
    batch[1] = _node("b", (2, 2, 1, 1), np.array([[[[1, 1], [2, 2]]]], np.float32))
    assert first_difference([graph(1.0), graph(2.0)], batch) is None


def test_a_verify_batch_stays_under_the_tiled_matmuls_rows():
    assert MAX_DRAFT + 1 < TILED_MIN_ROWS
    assert parse_cli(["-m", "x.gguf", "--ngram", "--draft", str(MAX_DRAFT)]).draft == MAX_DRAFT
    with pytest.raises(UserError, match="--draft"):
        parse_cli(["-m", "x.gguf", "--ngram", "--draft", str(MAX_DRAFT + 1)])


def test_a_llamafile_build_is_named_inexact():
    assert "GGML_LLAMAFILE=OFF" in (batch_inexact_reason("CPU : AVX2 = 1 | LLAMAFILE = 1 | OPENMP = 1 |") or "")
    assert batch_inexact_reason("CPU : AVX2 = 1 | OPENMP = 1 | REPACK = 1 |") is None
    for fa in ("on", "auto"):  # flash attention's split-KV decode
        assert "--flash-attn" in (batch_inexact_reason("CPU : AVX2 = 1 | OPENMP = 1 |", fa) or "")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exact")
    specs = {"f32-dense": ModelSpec(expert_type="q4_k", seed=1),  # f32 matmuls: tinyBLAS<16, __m512> when llamafile
             "q8_0": ModelSpec(expert_type="q8_0", dense_type="q8_0", seed=2),  # tinyBLAS_Q0 for Q8_0 dense
             "f16-dense": ModelSpec(expert_type="q4_k", dense_type="f16", seed=3),
             # 4 experts, top-2: a 7-token batch gives an expert up to 7 rows
             "4-experts": ModelSpec(n_expert=4, n_expert_used=2, expert_type="q4_k", seed=9)}
    return {k: make_model(d / f"{k}.gguf", s)[0] for k, s in specs.items()}


def _probe(model: Path, *flags: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(SCRIPT), str(model), "--gen", "10", *flags]
    for p in PROMPTS:
        argv += ["--prompt", p]
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)


@pytest.mark.engine
@pytest.mark.parametrize("name", ["f32-dense", "q8_0", "f16-dense"])
@pytest.mark.parametrize("stream", [False, True], ids=["resident", "streamed"])
def test_a_verify_batch_equals_one_token_decoding_bit_for_bit(models, name, stream):
    r = _probe(models[name], "--n", "5", *(["--stream"] if stream else ["--nodes"]))
    assert r.returncode == 0, (f"a verify batch's logits differ from one-token decoding: is llama.cpp built with "
                               f"-DGGML_LLAMAFILE=OFF (scripts/setup.sh)?\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    assert "DIFFERENT" not in r.stdout and "4/4 windows bit-identical" in r.stdout, r.stdout


@pytest.mark.engine
def test_the_longest_verify_batch_equals_one_token_decoding(models):
    """7 positions (--draft 6, its most) on 4 experts, top-2: an expert gets up to 7 rows, one short of where
    ggml-cpu's tiled K-quant matmul would take it (and round differently: 17 positions differ here)."""
    for stream in (["--nodes"], ["--stream"]):
        r = _probe(models["4-experts"], "--n", "7", "--gen", "14", *stream)
        assert r.returncode == 0 and "4/4 windows bit-identical" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.engine
def test_a_verify_batch_past_512_cached_tokens_equals_one_token_decoding(models):
    """With 512+ KV cells a one-token decode's flash attention splits the KV over the threads (another summation
    order than a batch's rows get); the engine's contexts have flash attention off, so this holds."""
    long = " ".join(str(i % 10 + 1) for i in range(300))  # 600 byte tokens
    for stream in (["--nodes"], ["--stream"]):
        r = subprocess.run([sys.executable, str(SCRIPT), str(models["f32-dense"]), "-c", "1024", "--gen", "10",
                            "--prompt", long, *stream], capture_output=True, text=True, errors="replace", timeout=600)
        assert r.returncode == 0 and "2/2 windows bit-identical" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
