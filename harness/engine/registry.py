"""Supported MoE architectures: one row each. A new architecture is one row here.

The row names which per-layer tensors hold the routed experts (streamed) and which graph node carries
the routing decision. Everything else (shared experts, router, attention, norms) stays resident.
Expert counts, top-k and tensor layouts always come from the model file, never from the row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchRow:
    arch: str
    expert_tensors: tuple[str, ...]  # blk.<il>.<name>.weight, in graph order: the last one (down) is
    # computed after the others, so its reads may overlap their compute
    topk_node: str = "ffn_moe_topk"  # graph node "<topk_node>-<il>" holding the selected expert ids
    note: str = ""


REGISTRY: dict[str, ArchRow] = {
    row.arch: row
    for row in (
        ArchRow("qwen3moe", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="Qwen3 MoE (e.g. Qwen3-30B-A3B); router resident"),
        ArchRow("qwen2moe", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="Qwen2/Qwen1.5 MoE; shared experts (ffn_*_shexp) and router stay resident"),
        # gpt-oss computes up before gate. Its per-expert biases (ffn_*_exps.bias, added to the selected
        # experts' outputs by ADD_ID nodes) stay resident: 4*(2*n_ff_exp + n_embd) bytes per expert, 0.26% of its
        # MXFP4 weights; streaming them would add three sub-page reads per expert miss for no memory worth having
        ArchRow("gpt-oss", ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"),
                note="OpenAI gpt-oss (MXFP4 experts); expert biases, router (+bias), attention sinks resident"),
        # archb: standard expert names; what differs (MTP blocks, leading/interleaved dense layers, shared
        # experts, exp_probs_b) is read from the file by gguf_layout, not from the row
        ArchRow("qwen35moe", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="Qwen3.5/3.6 MoE: gated delta net + attention; shared expert resident; MTP block not loaded"),
        ArchRow("qwen3next", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="Qwen3-Next: gated delta net + attention; shared expert resident; MTP block not loaded"),
        ArchRow("lfm2moe", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="LFM2 MoE: short convolutions + attention; leading dense blocks, exp_probs_b resident"),
        ArchRow("minimax-m2", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="MiniMax-M2: sigmoid routing with exp_probs_b (resident)"),
        ArchRow("llama4", ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
                note="Llama 4: MoE every n-th layer (interleaved dense FFNs), shared expert resident"),
    )
}


def supported() -> str:
    return ", ".join(sorted(REGISTRY))


def list_archs_text() -> str:
    lines = ["supported MoE architectures (streamed tensors; everything else stays resident):"]
    for row in sorted(REGISTRY.values(), key=lambda r: r.arch):
        lines.append(f"  {row.arch:10s} {', '.join(row.expert_tensors)}  - {row.note}")
    return "\n".join(lines)
