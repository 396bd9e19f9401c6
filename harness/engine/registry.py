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


# Expert tensors a file may fuse: ffn_gate_up_exps {n_embd, 2*n_ff_exp, n_expert} replaces a row's gate and up
# wherever llama.cpp's loader allows it (one MUL_MAT_ID, "ffn_moe_gate_up"). A fact of the file, read per layer by
# gguf_layout, never a row of its own.
FUSED_EXPERTS: dict[str, tuple[str, ...]] = {"ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps")}

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


def supported() -> str:
    return ", ".join(sorted(REGISTRY))


def list_archs_text() -> str:
    lines = ["supported MoE architectures (streamed tensors; everything else stays resident):"]
    for row in sorted(REGISTRY.values(), key=lambda r: r.arch):
        lines.append(f"  {row.arch:10s} {', '.join(row.expert_tensors)}  - {row.note}")
    return "\n".join(lines)
