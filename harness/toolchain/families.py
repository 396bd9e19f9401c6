"""The families: transformers' config and model class, the tiny shape, the tokenizer kind and the GGUF architecture
the pinned converter writes. Shapes: hidden 256 (a multiple of 256, so llama-quantize's k-quants and IQ4_XS take the
rows that read along it); 32 routed experts of width 128, enough that a 1 MiB cache evicts (the down projections'
rows are 128 long: llama-quantize falls back to another type for them, as users' files of such shapes have); top-2;
2-4 layers; 6-12 MB in f16.

Families of bmoe's registry not here (docs/real-toolchain.md): minimax-m2, bailingmoe2, lfm2moe, qwen35moe, gemma4,
deepseek4, bailingmoe3: transformers 4.57.6 has no model class for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HIDDEN = 256
EXPERT_FF = 128
DENSE_FF = 512
N_EXPERT = 32


@dataclass(frozen=True)
class Family:
    name: str  # bmoe's name for it (the file stem)
    arch: str  # general.architecture of the converted file
    config: str  # transformers config class
    model: str  # transformers model class
    kwargs: dict[str, Any] = field(default_factory=dict)
    tokenizer: str = "bpe"  # bpe (tokenizer.json, qwen2 pre-tokenizer), spm (tokenizer.model) or hy (bpe + remote code)
    seed: int = 0
    note: str = ""
    convert_args: tuple[str, ...] = ()  # the converter's own options this family needs


_COMMON: dict[str, Any] = dict(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=2048, tie_word_embeddings=False, num_hidden_layers=2,
                               initializer_range=0.08, rms_norm_eps=1e-6)
_MLA: dict[str, Any] = dict(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
                            n_routed_experts=N_EXPERT, n_shared_experts=1, moe_intermediate_size=EXPERT_FF,
                            intermediate_size=DENSE_FF, first_k_dense_replace=1, num_hidden_layers=3,
                            num_experts_per_tok=2, n_group=1, topk_group=1, num_key_value_heads=4)


def _f(name: str, arch: str, config: str, model: str, seed: int, tokenizer: str = "bpe", note: str = "",
       convert_args: tuple[str, ...] = (), **kw: Any) -> Family:
    return Family(name, arch, config, model, {**_COMMON, **kw}, tokenizer, seed, note, convert_args)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _f("qwen3moe", "qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", 1, intermediate_size=DENSE_FF,
       moe_intermediate_size=EXPERT_FF, num_experts=N_EXPERT, num_experts_per_tok=2, head_dim=64, norm_topk_prob=True),
    _f("qwen2moe", "qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", 2, intermediate_size=DENSE_FF,
       moe_intermediate_size=EXPERT_FF, shared_expert_intermediate_size=256, num_experts=N_EXPERT,
       num_experts_per_tok=2),
    _f("mixtral", "llama", "MixtralConfig", "MixtralForCausalLM", 3, tokenizer="spm", intermediate_size=EXPERT_FF,
       num_local_experts=N_EXPERT, num_experts_per_tok=2, head_dim=64),
    _f("olmoe", "olmoe", "OlmoeConfig", "OlmoeForCausalLM", 4, intermediate_size=EXPERT_FF, num_experts=N_EXPERT,
       num_key_value_heads=4,  # llama.cpp sizes olmoe's k-norm n_embd: as OLMoE's own, kv heads = heads
       num_experts_per_tok=2),
    _f("gpt-oss", "gpt-oss", "GptOssConfig", "GptOssForCausalLM", 5, intermediate_size=EXPERT_FF,
       num_local_experts=N_EXPERT, num_experts_per_tok=2, head_dim=64, sliding_window=128,
       max_position_embeddings=131072, layer_types=["sliding_attention", "full_attention"]),
    # q_lora_rank set: llama.cpp takes a deepseek2 file without q_lora_rank for V2-Lite only, and knows Lite by its
    # layer count (26 or 27): a 3-layer V2 without it fails to load ("key not found ... q_lora_rank")
    _f("deepseek2", "deepseek2", "DeepseekV2Config", "DeepseekV2ForCausalLM", 6, q_lora_rank=64,
       topk_method="greedy", **_MLA),
    _f("deepseek3", "deepseek2", "DeepseekV3Config", "DeepseekV3ForCausalLM", 7, q_lora_rank=64, **_MLA),
    _f("granitemoe", "granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM", 8, intermediate_size=EXPERT_FF,
       num_local_experts=N_EXPERT, num_experts_per_tok=2, embedding_multiplier=12.0, logits_scaling=4.0,
       residual_multiplier=0.22, attention_multiplier=0.015625),
    _f("ernie4_5-moe", "ernie4_5-moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", 9, tokenizer="spm",
       intermediate_size=256, moe_intermediate_size=EXPERT_FF, moe_num_experts=N_EXPERT, moe_k=2,
       moe_num_shared_experts=1, moe_layer_start_index=1, num_hidden_layers=3, use_bias=False),
    # kv heads = heads, as dots.llm1's own: llama.cpp's dots1 loader sizes attn_k/attn_v by n_head, not n_head_kv.
    # scoring_func: transformers' Dots1 always routes by sigmoid, but only this config key (dots.llm1's config.json
    # has it) makes the converter write expert_gating_func; without it llama.cpp aborts in its MoE builder
    _f("dots1", "dots1", "Dots1Config", "Dots1ForCausalLM", 10, intermediate_size=DENSE_FF, num_key_value_heads=4,
       scoring_func="sigmoid",
       moe_intermediate_size=EXPERT_FF, n_routed_experts=N_EXPERT, n_shared_experts=1, first_k_dense_replace=1,
       num_hidden_layers=3, num_experts_per_tok=2, n_group=1, topk_group=1),
    _f("glm4moe", "glm4moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", 11, intermediate_size=DENSE_FF,
       moe_intermediate_size=EXPERT_FF, n_routed_experts=N_EXPERT, n_shared_experts=1, first_k_dense_replace=1,
       num_hidden_layers=3, num_experts_per_tok=2, n_group=1, topk_group=1, head_dim=64, partial_rotary_factor=0.5,
       attention_bias=True, use_qk_norm=False, num_nextn_predict_layers=0,
       note="num_nextn_predict_layers=0: transformers' class has no MTP layer to save"),
    # --no-mtp: the converter expects Qwen3-Next's MTP block (mtp.*), which transformers' class does not build
    _f("qwen3next", "qwen3next", "Qwen3NextConfig", "Qwen3NextForCausalLM", 12, convert_args=("--no-mtp",),
       num_hidden_layers=4,
       intermediate_size=DENSE_FF, moe_intermediate_size=EXPERT_FF, shared_expert_intermediate_size=EXPERT_FF,
       num_experts=N_EXPERT, num_experts_per_tok=2, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=32,
       linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, partial_rotary_factor=0.25,
       layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
    # Llama 4's text model: top-1 routing with a shared expert, MoE every 2nd layer (Maverick's interleave); 6 layers
    # (3 MoE), so that top-1 still touches more than a 1 MiB cache holds at IQ4_XS
    _f("llama4", "llama4", "Llama4TextConfig", "Llama4ForCausalLM", 13, num_hidden_layers=6,
       intermediate_size=EXPERT_FF, intermediate_size_mlp=DENSE_FF, num_local_experts=N_EXPERT,
       num_experts_per_tok=1, interleave_moe_layer_step=2, head_dim=64),
    # transformers' HunYuan MoE sizes experts and the shared MLP by intermediate_size; the converter reads the
    # per-layer lists of Hunyuan's own config.json (extra keys the config keeps)
    _f("hunyuan-moe", "hunyuan-moe", "HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", 14, tokenizer="hy",
       intermediate_size=EXPERT_FF, moe_intermediate_size=[EXPERT_FF] * 2, num_experts=N_EXPERT, moe_topk=[2, 2],
       num_shared_expert=[1, 1], head_dim=64, use_qk_norm=True),
)}
