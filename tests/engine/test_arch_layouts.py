"""Architectures without llama.cpp: layout facts come from the file (per-layer top-k, nextn layers, leading dense
blocks, shared experts, expert companions), the registry keeps only the quirks (everything else streams through
the default row), refusals are one line naming what is supported, and `--list-archs` and the README's table
follow the registry."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader
from gguf.constants import GGUFValueType as VT

from harness.bench_cli import main as bench_main
from harness.engine.model import registry
from harness.engine.model.gguf_layout import load_layout
from harness.engine.model.llama_archs import LLAMA_ARCHS
from harness.errors import UserError
from harness.synth import ModelSpec, archs, make_model, plan_model
from harness.synth.gguf_encode import KV, TensorInfo, encode_header
from harness.synth.shapes import shape_spec
from tests.gates.test_arch_gates import ARCH_SPECS

REPO = Path(__file__).resolve().parents[2]
# archs with a module of their own whose tiny model has 4 blocks (qwen35moe/qwen3next add an MTP block, lfm2moe has 6)
NAMES = ("granitemoe", "llama", "deepseek2", "glm4moe", "ernie4_5-moe", "hunyuan-moe", "dots1", "bailingmoe2",
         "gemma4", "deepseek4", "bailingmoe3")


def _tiny(tmp_path: Path, arch: str, **kw) -> Path:
    spec = dataclasses.replace(ARCH_SPECS.get(arch, ModelSpec(arch=arch)), **kw)
    return make_model(tmp_path / f"{arch}.gguf", spec)[0]


def test_every_layout_module_is_named_and_dispatched() -> None:
    assert set(NAMES) <= set(archs.names())
    assert set(archs.names()) <= LLAMA_ARCHS
    from harness.engine.model.registry import COVERED

    gates = {c.arch: c.gate for c in COVERED}
    for name in archs.names():  # gated in test_arch_gates.py, or in a gate file of its own that exists
        assert name in ARCH_SPECS or (REPO / gates.get(name, "-")).is_file(), \
            f"{name} has a synthetic layout but no byte-identity gate"


@pytest.mark.parametrize("arch", [*NAMES, "olmoe"])
def test_make_model_writes_each_arch_with_its_own_metadata(tmp_path: Path, arch: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "m.gguf"
    assert bench_main(["make-model", str(out), "--arch", arch, "--seed", "3"]) == 0
    capsys.readouterr()
    r = GGUFReader(out)
    assert r.fields["general.architecture"].contents() == arch
    assert r.fields[f"{arch}.block_count"].contents() == 4
    names = [t.name for t in r.tensors]
    assert len(names) == len(set(names)) == len(plan_model(shape_spec("tiny", arch=arch, seed=3)).tensors)
    # same flags and seed: the same bytes
    again = tmp_path / "again.gguf"
    assert bench_main(["make-model", str(again), "--arch", arch, "--seed", "3"]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_leading_dense_blocks_and_shared_experts_are_resident(tmp_path: Path) -> None:
    lay = load_layout(_tiny(tmp_path, "deepseek2"))
    assert lay.dense_layers == [0] and lay.moe_layers == [1, 2, 3]
    assert lay.facts() == "dense layers [0] (no experts); 9 shared-expert tensors resident"
    assert lay.expert_bytes_per_layer()[0] == 0
    assert "blk.0.ffn_gate.weight" in lay.dense and "blk.1.exp_probs_b.bias" in lay.dense
    assert set(lay.shared_experts) == {f"blk.{il}.ffn_{k}_shexp.weight" for il in (1, 2, 3)
                                      for k in ("gate", "up", "down")}
    assert set(lay.shared_experts) <= set(lay.dense)
    assert all("shexp" not in n for n in lay.experts)


def test_nextn_layer_is_counted_in_block_count_but_not_in_the_trunk(tmp_path: Path) -> None:
    path = _tiny(tmp_path, "glm4moe")
    assert GGUFReader(path).fields["glm4moe.block_count"].contents() == 6
    lay = load_layout(path)
    assert (lay.n_layer, lay.n_layer_nextn, lay.n_layer_trunk) == (6, 1, 5)
    assert lay.moe_layers == [1, 2, 3, 4] and lay.dense_layers == [0]
    plan = plan_model(ARCH_SPECS["glm4moe"])
    nextn = [t for t in plan.tensors if t.layer == 5]
    assert any(t.expert_role for t in nextn) and any("nextn.eh_proj" in t.name for t in nextn)
    assert lay.nextn_bytes == sum(t.nbytes for t in nextn)
    assert not any(n.startswith("blk.5.") for n in [*lay.experts, *lay.dense])
    assert lay.expert_bytes_per_layer()[5] == 0  # the token cycle and the cache plan leave it out
    assert "1 nextn (MTP) layer(s) not in the trunk" in lay.facts()


def test_expert_scale_companions_stay_resident(tmp_path: Path) -> None:
    lay = load_layout(_tiny(tmp_path, "llama"))
    want = {f"blk.{il}.ffn_{k}_exps.scale" for il in range(4) for k in ("gate", "up", "down")}
    assert set(lay.companions) == want and want <= set(lay.dense)
    assert sorted(lay.experts) == sorted(f"blk.{il}.ffn_{k}_exps.weight" for il in range(4)
                                         for k in ("gate", "up", "down"))


def test_expert_bias_companions_stay_resident(tmp_path: Path) -> None:
    lay = load_layout(make_model(tmp_path / "g.gguf", ModelSpec(arch="gpt-oss"))[0])
    assert set(lay.companions) == {f"blk.{il}.ffn_{k}_exps.bias" for il in range(4) for k in ("gate", "up", "down")}
    assert "12 expert .scale/.bias companions resident" in lay.facts()


def test_per_layer_expert_used_count_array(tmp_path: Path) -> None:
    lay = load_layout(_tiny(tmp_path, "qwen3moe", expert_used_per_layer=(2, 1, 2, 2)))
    assert lay.expert_used_is_array and lay.expert_used_by_layer == (2, 1, 2, 2)
    assert lay.n_expert_used == 2
    flat = load_layout(_tiny(tmp_path, "granitemoe"))
    assert not flat.expert_used_is_array and flat.expert_used_by_layer == (2, 2, 2, 2)
    with pytest.raises(UserError, match="expert_used_per_layer has 3 values for 4 layers"):
        plan_model(ModelSpec(expert_used_per_layer=(2, 2, 2)))


def test_n_expert_used_override_refused_on_a_per_layer_array(tmp_path: Path) -> None:
    path = _tiny(tmp_path, "qwen3moe", expert_used_per_layer=(2, 2, 2, 2))
    p = subprocess.run([sys.executable, "-m", "harness.engine.cli", "-m", str(path), "-p", "x", "-n", "1",
                        "--moe-stream", "--n-expert-used", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "expert_used_count per layer" in p.stderr and "Traceback" not in p.stderr


def _header_only(path: Path, arch: str, tensors: list[tuple[str, tuple[int, ...]]], n_expert: int = 8) -> Path:
    kvs = [KV("general.architecture", VT.STRING, arch), KV(f"{arch}.expert_count", VT.UINT32, n_expert),
           KV(f"{arch}.block_count", VT.UINT32, 1)]
    infos, off = [], 0
    for name, ne in tensors:
        infos.append(TensorInfo(name, ne, 0, off))
        n = 4
        for d in ne:
            n *= d
        off += (n + 31) // 32 * 32
    header = encode_header(kvs, infos)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + off)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(UserError) as e:
        load_layout(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_refusals_are_one_line_naming_what_is_supported(tmp_path: Path) -> None:
    dense = _refusal(make_model(tmp_path / "d.gguf", ModelSpec(arch="qwen3"))[0])
    assert "dense model" in dense and "olmoe" in dense
    unknown = _refusal(_header_only(tmp_path / "u.gguf", "notanarch", [("blk.0.ffn_gate_exps.weight", (32, 32, 8))]))
    assert "not one the pinned llama.cpp can load" in unknown and "--list-archs" in unknown
    odd = _refusal(_header_only(tmp_path / "o.gguf", "qwen3moe", [("blk.0.ffn_w13_exps.weight", (32, 64, 8)),
                                                                   ("blk.0.ffn_w2_exps.weight", (32, 32, 8))]))
    assert "expert layout bmoe does not know" in odd and "ffn_w13_exps" in odd
    assert all(k in odd for k in registry.STANDARD)
    partial = _refusal(_header_only(tmp_path / "p.gguf", "qwen3moe", [("blk.0.ffn_down_exps.weight", (32, 32, 8))]))
    assert "layer 0 has expert tensors ['ffn_down_exps']" in partial


def test_registry_keeps_only_quirks_and_everything_else_takes_the_default_row() -> None:
    for arch, row in registry.REGISTRY.items():
        assert dataclasses.replace(row, arch="*", note=registry.DEFAULT.note) != registry.DEFAULT, (
            f"{arch}'s row is the default row: delete it")
    for arch in ("qwen3moe", "deepseek2", "some-future-moe"):
        row = registry.row_for(arch)
        assert row.arch == arch and row.expert_tensors == registry.STANDARD and row.topk_node == "ffn_moe_topk"
    assert registry.row_for("gpt-oss").expert_tensors[0] == "ffn_up_exps"


def test_list_archs_prints_each_covered_arch_with_its_layout() -> None:
    p = subprocess.run([sys.executable, "-m", "harness.engine.cli", "--list-archs"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    for c in registry.COVERED:
        line = next(ln for ln in p.stdout.splitlines() if ln.split() and ln.split()[0] == c.arch)
        assert "ffn_down_exps" in line and c.layout in line
    assert "default row" in p.stdout


def test_covered_archs_have_their_gate() -> None:
    for c in registry.COVERED:
        assert (REPO / c.gate).exists(), c
        if c.gate.endswith("test_arch_gates.py"):
            assert c.arch in ARCH_SPECS, f"{c.arch} is listed as covered by {c.gate} but has no spec there"


def test_readme_arch_table_is_the_registry() -> None:
    text = (REPO / "README.md").read_text()
    a, b = text.find(registry.README_BEGIN), text.find(registry.README_END)
    assert a >= 0 and b > a, "README has no generated architecture table"
    assert text[a:b + len(registry.README_END)] == registry.readme_section(), (
        "README's architecture table is stale: run `python -m harness.engine.model.registry --update-readme README.md`")
