"""The fields of a synthetic model, declared once: each one's type and default, the `bmoe-bench make-model` flag
that sets it, and whether a campaign's `model: {recipe: ...}` may set it.

`harness.synth.ModelSpec` is `ModelFields` with its behaviour (the arch registry's view of it), `make-model`
builds one option per field with a flag, and the campaign file's `Recipe` takes the fields marked for it
(harness.formats.campaign). A recipe is stored in the campaign file and the manifest, so the keys it takes are a
stored format: mark a field `recipe=False` unless campaigns should set it.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

_META = "bmoe.model_field"


@dataclass(frozen=True)
class Meta:
    flag: str | None  # the make-model flag that sets it (None: no flag)
    help: str  # that flag's help
    recipe: bool  # a campaign recipe may set it


def spec(default: Any, flag: str | None = None, help: str = "", *, recipe: bool = True) -> Any:
    """One declared field: `name: type = spec(default, "--flag", "help")`."""
    return field(default=default, metadata={_META: Meta(flag, help, recipe)})


@dataclass(frozen=True)
class ModelFields:
    """A synthetic model's fields. Same fields (seed included) -> byte-identical file(s)."""

    arch: str = spec("qwen3moe", "--arch")
    # blocks, except that qwen35moe/qwen3next count the trunk only and add their MTP blocks (block_count = n_layer +
    # n_nextn) while glm4moe counts its nextn layer (the last of n_layer); the synthetic files' names carry n_layer
    n_layer: int = spec(4, "--layers", "Number of layers.")
    n_expert: int = spec(8, "--experts", "Routed experts per layer.")
    n_expert_used: int = spec(2, "--top-k", "Experts used per token.")
    n_embd: int = spec(256, "--embd", "Embedding width.")
    n_ff_exp: int = spec(256, "--expert-ff", "Expert FFN width.")
    n_ff_shexp: int = spec(512, "--shared-ff", "Shared expert width (qwen2moe).")
    n_ff: int = spec(512, "--dense-ff", "FFN width of the dense arch (qwen3).")
    n_head: int = spec(4, "--heads", "Attention heads.")
    n_head_kv: int = spec(2, "--heads-kv", "KV heads.")
    head_dim: int = spec(64, "--head-dim", "Head dimension.")
    n_vocab: int = spec(320, "--vocab", "Vocabulary size (>= 261; byte-level).")
    ctx_len: int = spec(4096, "--ctx", "Training context length written to the metadata.")
    expert_type: str = spec("q4_k", "--expert-type", "f32, q8_0, q4_k, mxfp4 or q5_0 (default: q4_k; mxfp4 for "
                                                     "gpt-oss); iq2_s for --dry-run sizing only.")
    # the down projection's type where it differs (a K-quant file whose n_ff_exp is no multiple of 256 falls back to
    # Q5_0/Q8_0 for down, as llama.cpp's quantiser does); "" = expert_type
    expert_down_type: str = spec("", recipe=False)
    dense_type: str = spec("f32", "--dense-type", "f32, f16 or q8_0 (attention, embeddings).")
    # a name in tokenizer.TEMPLATES (chatml, harmony, qwen3, none); "" = the arch's own
    chat_template: str = spec("", "--chat-template")
    # sliding-window size (gpt-oss: every other layer, from layer 0, as llama.cpp's default)
    n_swa: int = spec(128, "--swa", "Sliding-window size (gpt-oss; default 128).", recipe=False)
    seed: int = spec(0, "--seed", "Seed; same flags and seed give identical bytes.")
    n_split: int = spec(1, "--split", "Number of shards.")
    rms_eps: float = spec(1e-6, recipe=False)
    rope_freq_base: float = spec(1_000_000.0, recipe=False)
    rope_yarn_factor: float = spec(0.0, recipe=False)  # 0: no RoPE scaling keys; else YaRN with this factor
    rope_yarn_orig_ctx: int = spec(0, recipe=False)  # YaRN's original context length
    # integer knobs of an arch that has its own module under harness/synth/archs/ (name, value), over that
    # module's PARAMS defaults, e.g. (("q_lora_rank", 1024),); a recipe gives them as a mapping
    arch_params: tuple[tuple[str, int], ...] = spec(())
    # options of an arch laid out by its own module in harness.synth.archs (its OPTS names them), as pairs
    arch_opts: tuple[tuple[str, Any], ...] = spec((), recipe=False)
    # write expert_used_count as this per-layer array (any MoE arch)
    expert_used_per_layer: tuple[int, ...] = spec((), recipe=False)


def meta(f: Field) -> Meta:
    return f.metadata[_META]


def flag_fields() -> list[Field]:
    """The fields make-model has a flag for, in declaration order."""
    return [f for f in fields(ModelFields) if meta(f).flag]


def recipe_fields() -> list[Field]:
    """The fields a campaign recipe may set, in declaration order."""
    return [f for f in fields(ModelFields) if meta(f).recipe]
