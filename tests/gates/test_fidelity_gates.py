"""Fidelity gates (issue 26): on every architecture's tiny model, a run with lossless knobs scored against the plain
mmap run's reference (bmoe --fidelity-against) has KLD exactly 0 and the same top token at every position; a lossy
knob at its neutral value is exactly off; and the two negative controls show the measure can fail: fewer experts
per token than the model's, and one wrong expert loaded, give KLD above 0.

Scoring is teacher-forced in prompt batches (harness.engine.run.fidelity), so each run exercises the prefill path;
knobs that act only while decoding one token at a time (--prefetch, --predict-prefetch) are shown not to disturb it,
and the byte-identity gates cover their decode path. Each lossless run sets several knobs at once (fewer processes):
its KLD of 0 holds for each of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.engine.cache.policies import ONLINE_DEFAULT, POLICIES, is_offline
from harness.engine.model.gguf_layout import load_layout
from harness.synth import make_model
from tests.helpers.fidelity import TINY_MODELS, fidelity, text

pytestmark = pytest.mark.engine

NAMES = list(TINY_MODELS)
CTX = 64  # two chunks of 64 tokens: 62 scored positions per run
POLICY_LIST = sorted(p for p in POLICIES if not is_offline(p) and p != ONLINE_DEFAULT)


def _knobs(name: str, cache_mb: int) -> dict[str, tuple[str, ...]]:
    """The lossless knob sets of one architecture; the cache policy (other than the default, which the first set
    runs) turns with the architecture, so every policy is gated on some, as does the --recycle-pages kind. The
    evicting set also carries a lossy knob at its neutral value (--drop-cold-experts 0 skips none)."""
    policy = POLICY_LIST[NAMES.index(name) % len(POLICY_LIST)]
    return {
        "stream-cache-off-odirect": ("--moe-stream", "--cache-mb", "0"),
        "stream-evicting-2-lanes-buffered": ("--moe-stream", "--cache-mb", str(cache_mb), "--io-threads", "2",
                                             "--no-odirect", "--cache-policy", policy, "--dense-weights", "mmap",
                                             "--load-populate", "on", "--no-evict-thread", "--drop-cold-experts",
                                             "0", "--drop-in-prefill"),
        "stream-all-cached-prefetch-8-lanes": ("--moe-stream", "--cache-mb", "200", "--io-threads", "8",
                                               "--prefetch", "1", "--predict-prefetch", "--dense-weights", "warm"),
        "stream-evicting-recycled-3-lanes": ("--moe-stream", "--cache-mb", str(cache_mb), "--io-threads", "3",
                                             "--recycle-pages", ("move", "memfd")[NAMES.index(name) % 2]),
    }


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """name -> (model, reference): the plain mmap run's reference, made once per model."""
    d = tmp_path_factory.mktemp("fidelity")
    out: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in out:
            spec, _ = TINY_MODELS[name]
            (model,) = make_model(d / f"{name}.gguf", spec)
            ref = d / f"{name}.ref"
            r = fidelity(model, "-p", text(60), "-c", str(CTX), "--fidelity-chunks", "2", "--fidelity-ref", str(ref),
                         tmp=d)
            assert r.rc == 0, r.stderr
            out[name] = (model, ref)
        return out[name]

    return get


def _exactly_same(r) -> None:
    assert r.rc == 0, r.stderr
    c = r.csv.columns
    assert len(c["kld"]) == 2 * (CTX - 1 - CTX // 2)
    assert np.all(c["kld"] == 0.0), f"KLD above 0 at {np.flatnonzero(c['kld'])[:5]}: {c['kld'].max()}"
    assert np.all(c["same_top"] == 1) and np.all(c["dp"] == 0.0)
    assert r.line["kld_mean"] == "0" and r.line["same_top_pct"] == "100"


@pytest.mark.parametrize("knobs", ["stream-cache-off-odirect", "stream-evicting-2-lanes-buffered",
                                   "stream-all-cached-prefetch-8-lanes", "stream-evicting-recycled-3-lanes"])
@pytest.mark.parametrize("name", NAMES)
def test_lossless_knobs_give_kld_exactly_zero(refs, tmp_path, name, knobs):
    model, ref = refs(name)
    flags = _knobs(name, TINY_MODELS[name][1])[knobs]
    _exactly_same(fidelity(model, "--fidelity-against", str(ref), *flags, tmp=tmp_path))


@pytest.mark.parametrize("name", NAMES)
def test_resident_dense_anon_unpopulated_and_the_models_own_k_are_exactly_off(refs, tmp_path, name):
    """Resident, the dense weights in anonymous memory, an unpopulated load, and --n-expert-used at the model's own
    k (a lossy knob at its neutral value; not on a model with a per-layer expert count, which it cannot override)."""
    model, ref = refs(name)
    lay = load_layout(model)
    k = () if lay.expert_used_is_array else ("--n-expert-used", str(lay.n_expert_used))
    _exactly_same(fidelity(model, "--fidelity-against", str(ref), "--dense-weights", "anon", "--load-populate", "off",
                           *k, tmp=tmp_path))


NEGATIVE = ["olmoe", "qwen35moe", "gpt-oss"]  # a standard layout, a recurrent hybrid, a fused/biased expert layout


@pytest.mark.parametrize("name", NEGATIVE)
def test_fewer_experts_per_token_give_kld_above_zero(refs, tmp_path, name):
    model, ref = refs(name)
    k = load_layout(model).n_expert_used
    r = fidelity(model, "--fidelity-against", str(ref), "--n-expert-used", str(k - 1), tmp=tmp_path)
    assert r.rc == 0, r.stderr
    assert float(r.line["kld_mean"]) > 0 and r.csv.columns["kld"].max() > 0


@pytest.mark.parametrize("name", NEGATIVE)
def test_one_wrong_expert_gives_kld_above_zero(refs, tmp_path, name):
    """Expert 0's slot in the first MoE layer filled with expert 1's bytes (the prompt batches of 64 tokens route
    every token through that layer, so expert 0 is among those used)."""
    model, ref = refs(name)
    lay = load_layout(model)
    layer = min(lay.by_layer)
    r = fidelity(model, "--fidelity-against", str(ref), "--moe-stream", "--cache-mb", "0", tmp=tmp_path,
                 env={"BMOE_TEST_WRONG_EXPERT": f"{layer},0,1"})
    assert r.rc == 0, r.stderr
    assert float(r.line["kld_mean"]) > 0 and r.csv.columns["kld"].max() > 0
