"""Which MoE architectures stream, and how. The registry keeps only the quirks.

An architecture llama.cpp loads whose routed experts are `blk.<il>.ffn_{gate,up,down}_exps.weight` and whose
routing decision is the `ffn_moe_topk-<il>` node of llama.cpp's shared MoE builder streams through the
default row, with no row of its own. A row here names what differs (the tensors' graph order, another
routing node). Everything that is not a routed-expert matrix (shared experts, router, expert biases and
scales, leading dense blocks, attention, norms) stays resident. Expert counts, top-k (per layer or not),
nextn layers and tensor layouts always come from the model file, never from a row.

`COVERED` is documentation with a test behind each line: the architectures streamed byte-identically in CI on
a synthetic model, what their layout holds, and the gate that covers them (`bmoe --list-archs`, README).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

STANDARD: tuple[str, ...] = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class ArchRow:
    arch: str
    expert_tensors: tuple[str, ...] = STANDARD  # blk.<il>.<name>.weight, in graph order: the last one (down)
    # is computed after the others, so its reads may overlap their compute
    topk_node: str = "ffn_moe_topk"  # graph node "<topk_node>-<il>" holding the selected expert ids
    note: str = ""


DEFAULT = ArchRow("*", note="standard layout: llama.cpp's shared MoE builder, separate gate/up/down experts")

# Expert tensors a file may fuse: ffn_gate_up_exps {n_embd, 2*n_ff_exp, n_expert} replaces a row's gate and up
# wherever llama.cpp's loader allows it (one MUL_MAT_ID, "ffn_moe_gate_up"). A fact of the file, read per layer by
# gguf_layout, never a row of its own.
FUSED_EXPERTS: dict[str, tuple[str, ...]] = {"ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps")}

# quirks only: an architecture whose layout the default row does not describe
REGISTRY: dict[str, ArchRow] = {
    row.arch: row
    for row in (
        # gpt-oss computes up before gate. Its per-expert biases (ffn_*_exps.bias, added to the selected
        # experts' outputs by ADD_ID nodes) stay resident: 4*(2*n_ff_exp + n_embd) bytes per expert, 0.26% of its
        # MXFP4 weights; streaming them would add three sub-page reads per expert miss for no memory worth having
        ArchRow("gpt-oss", ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"),
                note="OpenAI gpt-oss (MXFP4 experts); expert biases, router (+bias), attention sinks resident"),
        # gemma4 computes its router outside the shared MoE builder (rms_norm(attn_out) * ffn_gate_inp.scale) and
        # passes the logits in; the selection is still ffn_moe_topk. Its files fuse gate and up (FUSED_EXPERTS);
        # the per-expert ffn_down_exps.scale {n_expert} and the dense MLP beside the experts stay resident
        ArchRow("gemma4", ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"),
                note="Gemma 4 MoE (fused gate_up); dense MLP, router (+scale), ffn_down_exps.scale resident"),
        # deepseek4's first hash_layer_count layers select experts by token id: their ffn_moe_topk is a GET_ROWS of
        # ffn_gate_tid2eid (resident), which the hook isolates like an argsort view (gguf_layout: token_routed_layers)
        ArchRow("deepseek4", ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"),
                note="DeepSeek V4 (e.g. V4 Flash); token-id routed first layers; shared expert, router (+exp_probs_b), "
                     "hyper-connections, compressed attention resident"),
        # bailingmoe3 (Ling 3) is a hybrid of KDA linear attention and gated MLA: both dense-side; its leading dense
        # blocks have no expert tensors, so they are not MoE layers of the layout
        ArchRow("bailingmoe3", ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"),
                note="Ling 3 (KDA linear attention + gated MLA); leading dense blocks, shared expert, router "
                     "(+exp_probs_b) resident"),
    )
}


def row_for(arch: str) -> ArchRow:
    """The architecture's own row, else the default row under its name."""
    row = REGISTRY.get(arch)
    return row if row is not None else dataclasses.replace(DEFAULT, arch=arch)


@dataclass(frozen=True)
class Covered:
    arch: str
    layout: str  # what the layout holds besides the streamed experts (all of it resident)
    gate: str  # the test module whose byte-identity gates cover it


_GATES = "tests/gates/test_arch_gates.py"

# one line per architecture; other engineers' architectures are added as lines of their own
COVERED: tuple[Covered, ...] = (
    Covered("qwen3moe", "router; q/k norms", "tests/gates/test_engine_gates.py"),
    Covered("qwen2moe", "shared expert (ffn_*_shexp) and its gate", "tests/gates/test_engine_gates.py"),
    Covered("gpt-oss", "expert biases (.bias), router bias, attention sinks; up before gate", "tests/gates/test_gptoss.py"),
    Covered("olmoe", "router; q/k norms over the full width", _GATES),
    Covered("granitemoe", "router; logit/residual/embedding scales", _GATES),
    Covered("llama", "Mixtral: router; per-expert .scale companions (optional, resident)", _GATES),
    Covered("deepseek2", "latent attention (kv_a/kv_b); expert groups; shared expert; exp_probs_b; "
                         "leading dense blocks", _GATES),
    Covered("glm4moe", "nextn (MTP) layer in block_count, not in the trunk; leading dense blocks; shared expert; "
                       "exp_probs_b; q/k/v biases", _GATES),
    Covered("ernie4_5-moe", "leading dense blocks; shared expert; exp_probs_b", _GATES),
    Covered("hunyuan-moe", "shared expert; q/k norms", _GATES),
    Covered("dots1", "leading dense blocks; shared expert; exp_probs_b", _GATES),
    Covered("bailingmoe2", "fused qkv; leading dense blocks; shared expert; exp_probs_b", _GATES),
    Covered("gemma4", "fused gate_up experts (from the file); dense MLP beside the experts; router outside the "
                      "MoE builder (+scale); ffn_down_exps.scale; up before gate", "tests/gates/test_gemma4.py"),
    Covered("deepseek4", "first layers routed by token id (GET_ROWS top-k); shared expert; exp_probs_b; "
                         "compressed attention; hyper-connections; up before gate", "tests/gates/test_deepseek4.py"),
    Covered("bailingmoe3", "KDA linear attention + gated MLA; leading dense blocks; shared expert; exp_probs_b; "
                           "up before gate", "tests/gates/test_bailingmoe3.py"),
    Covered("qwen35moe", "gated delta net + full attention; shared expert; MTP block (nextn) not loaded",
            "tests/gates/test_archs_b.py"),
    Covered("qwen3next", "gated delta net + full attention; shared expert; MTP block (nextn) not loaded",
            "tests/gates/test_archs_b.py"),
    Covered("lfm2moe", "short convolutions + attention (per-layer head_count_kv); leading dense blocks; exp_probs_b; "
                       "sigmoid gating", "tests/gates/test_archs_b.py"),
    Covered("minimax-m2", "sigmoid routing with exp_probs_b", "tests/gates/test_archs_b.py"),
    Covered("llama4", "MoE every n-th layer (interleaved dense FFNs); shared expert", "tests/gates/test_archs_b.py"),
)


def supported() -> str:
    return ", ".join(c.arch for c in sorted(COVERED, key=lambda c: c.arch))


def list_archs_text() -> str:
    lines = ["MoE architectures streamed byte-identically in CI (streamed tensors | resident layout facts):"]
    for c in sorted(COVERED, key=lambda c: c.arch):
        row = row_for(c.arch)
        quirk = "" if c.arch not in REGISTRY else "  [own row]"
        lines.append(f"  {c.arch:13s} {', '.join(row.expert_tensors)} | {c.layout}{quirk}")
    lines.append("Any other architecture llama.cpp loads whose routed experts are ffn_gate_exps, ffn_up_exps, "
                 "ffn_down_exps with an ffn_moe_topk node streams through the default row (no gate of its own).")
    return "\n".join(lines)


# -- the README's architecture table ------------------------------------------------------------------------------

README_BEGIN = "<!-- bmoe archs: generated by `python -m harness.engine.model.registry --update-readme README.md` -->"
README_END = "<!-- end of bmoe archs -->"


def readme_table() -> str:
    rows = ["| architecture | streamed experts | resident layout facts | gate |", "|---|---|---|---|"]
    for c in sorted(COVERED, key=lambda c: c.arch):
        row = row_for(c.arch)
        own = "" if c.arch not in REGISTRY else " (own row)"
        rows.append(f"| `{c.arch}` | {', '.join(f'`{t}`' for t in row.expert_tensors)}{own} | "
                    f"{c.layout.replace('|', '/')} | `{c.gate}` |")
    rows.append("| any other llama.cpp MoE arch | `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` (default row) | "
                "everything but the routed experts | none of its own |")
    return "\n".join(rows)


def readme_section() -> str:
    return f"{README_BEGIN}\n{readme_table()}\n{README_END}"


def update_readme(path: Path) -> None:
    text = path.read_text()
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        raise SystemExit(f"{path}: no generated architecture table (the markers {README_BEGIN!r} ... {README_END!r})")
    path.write_text(text[:a] + readme_section() + text[b + len(README_END):])


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.engine.model.registry", allow_abbrev=False,
                                description="The README's architecture table, derived from the registry.")
    p.add_argument("--update-readme", metavar="README", help="rewrite the table between its markers in place")
    ns = p.parse_args(argv)
    if ns.update_readme:
        update_readme(Path(ns.update_readme))
    else:
        print(readme_section())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
