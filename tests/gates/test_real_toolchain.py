"""The byte-identity gates on files made the way users' files are made: for each family of
harness/toolchain/families.py, transformers' own class (seeded random init) converted by the pinned llama.cpp's
convert_hf_to_gguf.py and quantized by its llama-quantize to Q8_0, Q4_K_M and IQ4_XS
(scripts/real-toolchain-models.sh). Each file streams token for token as it runs resident, with the cache off and
with a 1 MiB cache that evicts; one wrong expert makes the Q4_K_M file diverge; the converter's 3-shard split streams
too. The files are made once per session in BMOE_REAL_TOOLCHAIN_DIR (default ~/.cache/bmoe/real-toolchain/build),
and reused while the sources and tools are unchanged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from gguf import GGUFReader

from harness.formats.route_trace import DECODE, read_route_trace
from harness.toolchain.build import MANIFEST, QUANTS, SPLIT_FAMILY, SPLIT_QUANT, SPLIT_SHARDS
from harness.toolchain.families import FAMILIES
from tests.helpers.engine import Run, bmoe

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bmoe"
VENV = Path(os.environ.get("BMOE_TOOLCHAIN_VENV", CACHE / "toolchain-venv"))
TOOLS = Path(os.environ.get("BMOE_PERPLEXITY_DIR", CACHE / "llama-perplexity"))
OUT = Path(os.environ.get("BMOE_REAL_TOOLCHAIN_DIR", CACHE / "real-toolchain" / "build"))
N = 16  # tokens per run
# a prompt whose greedy reference is not degenerate on every quant of the family (random weights fall into repeats
# on some prompts: dots1's Q4_K_M ended its text after 2 tokens on the other one, and olmoe's Q4_K_M gave 4
# distinct tokens of 16 on dots1's)
PROMPT = "The expert cache keeps hot experts near."
PROMPTS = {"dots1": "Each token routes to a few experts."}
CELLS = [(f, q) for f in FAMILIES for q in QUANTS]


@pytest.fixture(scope="session")
def manifest() -> dict:
    if not (VENV / ".installed").exists() or not (TOOLS / "llama-quantize").exists() \
            or not (TOOLS / "src" / "convert_hf_to_gguf.py").exists():
        pytest.skip("no toolchain venv or llama-quantize: scripts/toolchain-venv.sh and "
                    "scripts/build-llama-perplexity.sh, then scripts/real-toolchain-models.sh")
    r = subprocess.run([str(REPO / "scripts" / "real-toolchain-models.sh"), str(OUT)], capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads((OUT / MANIFEST).read_text())


def path_of(manifest: dict, family: str, quant: str) -> Path:
    return OUT / manifest["families"][family]["files"][quant]


def degenerate(tokens: list[int]) -> bool:
    """Half the tokens or fewer distinct: a repeat could hide a wrong expert."""
    return len(set(tokens)) <= len(tokens) // 2


def prompt_of(model: Path) -> str:
    return next((p for f, p in PROMPTS.items() if model.name.startswith(f + "-")), PROMPT)


def run(model: Path, tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Run:
    r = bmoe(model, *flags, n=N, tmp=tmp, prompt=prompt_of(model), env=env)
    assert r.rc == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def resident(manifest, tmp_path_factory):
    """Each file's reference tokens from the plain mmap run (no hook), computed once."""
    d = tmp_path_factory.mktemp("resident")
    cache: dict[Path, list[int]] = {}

    def get(model: Path) -> list[int]:
        if model not in cache:
            r = run(model, d)
            assert len(r.tokens) == N, "the reference run stopped early; the gate needs a full stream"
            assert not degenerate(r.tokens), f"degenerate reference output {r.tokens}: pick another seed"
            cache[model] = r.tokens
        return cache[model]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_made_by_the_real_toolchain(manifest, family):
    """What the tools wrote: the family's architecture, a Q4_K_M mix (more than one type), llama-quantize's fallback
    for the 128-long down rows (not a multiple of 256: no k-quant), IQ4_XS where rows allow it."""
    fam = FAMILIES[family]
    r = GGUFReader(path_of(manifest, family, "Q4_K_M"))
    kv = {f.name: f for f in r.fields.values()}
    assert bytes(kv["general.architecture"].parts[-1]).decode() == fam.arch
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert len(set(types.values())) >= 3, types
    gate = next(n for n in types if n.endswith("ffn_gate_exps.weight"))
    down = next(n for n in types if n.endswith("ffn_down_exps.weight"))
    assert types[gate] == "Q4_K" and types[down] not in ("Q4_K", "Q5_K", "Q6_K"), types
    iq = {t.name: t.tensor_type.name for t in GGUFReader(path_of(manifest, family, "IQ4_XS")).tensors}
    assert iq[gate] == "IQ4_XS" and iq[down] == "IQ4_NL", iq
    fell = manifest["families"][family]["fallback_tensors"]["Q4_K_M"]  # from llama-quantize's own warnings
    assert down in fell and fell[down].split("->")[1] == types[down].lower(), fell


@pytest.mark.parametrize("family", list(FAMILIES))
def test_llama_cpp_tokenizes_as_the_checkpoint(manifest, family):
    """The converted vocabulary tokenizes a text as the checkpoint's own tokenizer (transformers) does."""
    llama_cpp = pytest.importorskip("llama_cpp")
    check = manifest["families"][family]["tokcheck"]
    llm = llama_cpp.Llama(model_path=str(path_of(manifest, family, "Q8_0")), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(check["text"].encode(), add_bos=False, special=False) == check["ids"]
    finally:
        llm.close()


@pytest.mark.parametrize(("family", "quant"), CELLS)
def test_streamed_equals_resident(manifest, resident, tmp_path, family, quant):
    model = path_of(manifest, family, quant)
    ref = resident(model)
    off = run(model, tmp_path, "--moe-stream", "--cache-mb", "0")
    assert off.tokens == ref
    assert off.summary["hit_pct"] == -1 and off.summary["mib_read_per_token"] > 0
    cached = run(model, tmp_path, "--moe-stream", "--cache-mb", "1")
    assert cached.tokens == ref
    assert cached.summary["evictions"] > 0, "the 1 MiB cache was meant to evict"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_wrong_expert_diverges(manifest, resident, tmp_path, family):
    """The negative control on the Q4_K_M file: an expert the first MoE layer uses in decode, loaded with its
    neighbour's bytes, changes the output. Up to 3 such experts are tried: on random weights one swap may move no
    argmax (granitemoe's residual multiplier of 0.22 damps what one expert adds)."""
    model = path_of(manifest, family, "Q4_K_M")
    trace = tmp_path / "t.route.csv"
    run(model, tmp_path, "--moe-stream", "--cache-mb", "0", "--route-trace", str(trace))
    rows = read_route_trace(trace).rows
    layer = min(r.layer for r in rows)
    experts = list(dict.fromkeys(r.expert for r in rows if r.phase == DECODE and r.layer == layer))[:3]
    n_expert = int(GGUFReader(model).fields[f"{FAMILIES[family].arch}.expert_count"].parts[-1][0])
    outs = [run(model, tmp_path, "--moe-stream", "--cache-mb", "0",
                env={"BMOE_TEST_WRONG_EXPERT": f"{layer},{e},{(e + 1) % n_expert}"}).tokens for e in experts]
    assert any(t != resident(model) for t in outs), f"no wrong expert of {experts} in layer {layer} diverged"


def test_converter_split_streams(manifest, resident, tmp_path):
    """The converter's --split-max-tensors shards, quantized by llama-quantize --keep-split: the same tokens as the
    whole file of the same quant, streamed and resident."""
    split = manifest["families"][SPLIT_FAMILY]["split"]
    shards = [OUT / f for f in split["files"]]
    assert split["quant"] == SPLIT_QUANT and len(shards) == SPLIT_SHARDS
    assert shards[0].name.endswith(f"-00001-of-{SPLIT_SHARDS:05d}.gguf")
    whole = resident(path_of(manifest, SPLIT_FAMILY, SPLIT_QUANT))
    assert resident(shards[0]) == whole
    assert run(shards[0], tmp_path, "--moe-stream", "--cache-mb", "1").tokens == whole


def test_pulled_from_the_hub_streams(manifest, resident, tmp_path):
    """The real toolchain's files served by the loopback hub (tests/helpers/hub.py) as users get them: the
    converter's 3-shard Q8_0 split and the whole Q4_K_M, pulled by `bmoe -hf` (every shard, each sha256 checked),
    and streamed: the same tokens as the whole local file resident."""
    from tests.helpers.engine import BMOE, read_csv
    from tests.helpers.hub import Hub

    folder = tmp_path / "repo"
    folder.mkdir()
    fam = manifest["families"][SPLIT_FAMILY]
    for f in [*fam["split"]["files"], fam["files"]["Q4_K_M"]]:
        os.link(OUT / f, folder / Path(f).name)
    hub = Hub()
    try:
        hub.add_repo("org/real-qwen3moe", folder)
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"),
               "BMOE_HASH_CACHE": str(tmp_path / "h.json"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}
        for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            env.pop(k, None)
        for quant in ("Q8_0", "Q4_K_M"):
            local = path_of(manifest, SPLIT_FAMILY, quant)
            csv = tmp_path / f"{quant}.csv"
            p = subprocess.run([*BMOE, "-hf", f"org/real-qwen3moe:{quant}", "-p", prompt_of(local), "-n", str(N),
                                "-t", "2", "--moe-stream", "--cache-mb", "1", "--csv", str(csv)],
                               capture_output=True, text=True, errors="replace", env=env, timeout=600)
            assert p.returncode == 0, p.stderr
            if quant == "Q8_0":
                assert "and 2 more shard(s)" in p.stderr, p.stderr
            assert read_csv(csv)[0] == resident(local), quant
    finally:
        hub.close()
