"""bmoe's fidelity figures against llama.cpp's own tool (issue 26): for two architectures, fewer experts per token
(--n-expert-used K, resident) scored by `bmoe --fidelity-against` and by `llama-perplexity --kl-divergence
--override-kv <arch>.expert_used_count=int:K` on the same tokens, context and batches agree: mean KLD within 2%
(relative) or one standard error, p99 within 2%, same-top % within one binomial error, RMS Δp within 2% or one
error. Skipped unless scripts/build-llama-perplexity.sh has built llama-perplexity from the vendored llama.cpp.

The tokens are llama-perplexity's own (its base file holds them) and bmoe's (its reference): the test checks they
are the same. bmoe's reference keeps the whole vocabulary here (--fidelity-top-k 0), llama.cpp's its uint16 form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import kld
from harness.formats.fidelity import read_ref
from harness.synth import make_model
from tests.helpers.fidelity import TINY_MODELS, fidelity, text
from tests.helpers.perplexity import base_tokens, kld_figures, llama_perplexity, run

pytestmark = pytest.mark.engine

CTX = 128  # 4 chunks: 4 x 63 = 252 scored positions


def _close(a: float, b: float, se: float, rel: float = 0.02) -> bool:
    return abs(a - b) <= max(rel * abs(b), se)


@pytest.mark.parametrize("name", ["olmoe", "deepseek2"])
def test_n_expert_used_matches_llama_perplexity(tmp_path: Path, name: str):
    binary = llama_perplexity()
    spec, _ = TINY_MODELS[name]
    (model,) = make_model(tmp_path / f"{name}.gguf", spec)
    k = spec.n_expert_used - 1
    body = text(200)  # more than 4 chunks: both score the first 4
    tf = tmp_path / "text.txt"
    tf.write_text(body)
    base = tmp_path / "lc.base"
    run(binary, model, CTX, "-f", str(tf), "--chunks", "4", "--kl-divergence-base", str(base))
    log = run(binary, model, CTX, "--kl-divergence-base", str(base), "--kl-divergence",
              "--override-kv", f"{spec.arch}.expert_used_count=int:{k}", until="Same top p:")
    lc = kld_figures(log)

    ref = tmp_path / "b.ref"
    r = fidelity(model, "-p", body, "-c", str(CTX), "--fidelity-chunks", "4", "--fidelity-ref", str(ref),
                 "--fidelity-top-k", "0", tmp=tmp_path)
    assert r.rc == 0, r.stderr
    toks = read_ref(ref).tokens
    assert toks.shape[0] == 4 and np.array_equal(toks, base_tokens(base)), "not the same tokens as llama-perplexity"
    a = fidelity(model, "--fidelity-against", str(ref), "--n-expert-used", str(k), tmp=tmp_path)
    assert a.rc == 0, a.stderr
    c = a.csv.columns
    s = kld.summarize(kld.Against(kld=c["kld"], same_top=c["same_top"] == 1, dp=c["dp"], run_top=c["run_top"],
                                      next_lp=c["lp_run"]))
    assert s.positions == 252 and lc["kld_mean"] > 0.01, "the knob must move the model for the comparison to mean much"
    print(f"{name} K={k}: bmoe kld_mean={s.kld_mean:.6f}±{s.kld_se:.6f} p99={s.kld_pct[99.0]:.6f} "
          f"max={s.kld_max:.6f} same_top={100 * s.same_top:.3f}±{100 * s.same_top_se:.3f}% "
          f"dp_rms={100 * s.dp_rms:.3f}%; llama-perplexity {lc}")
    assert _close(s.kld_mean, lc["kld_mean"], lc["kld_se"]), (s.kld_mean, lc)
    assert float(a.line["kld_mean"]) == pytest.approx(s.kld_mean, rel=1e-5)
    assert _close(s.kld_pct[99.0], lc["kld_p99"], 0.0), (s.kld_pct, lc)
    assert abs(100 * s.same_top - lc["same_top_pct"]) <= max(lc["same_top_se_pct"], 1e-9), (s.same_top, lc)
    assert _close(100 * s.dp_rms, lc["dp_rms_pct"], lc["dp_rms_se_pct"]), (s.dp_rms, lc)
