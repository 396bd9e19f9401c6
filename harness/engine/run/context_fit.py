"""`-c N` checked before llama.cpp allocates it: the KV cache llama.cpp clears (so touches) at context creation
must fit the memory there is, and N must fit llama.cpp's 32-bit n_ctx (ctypes would wrap it silently).

The KV cache is estimated from the GGUF header as a lower bound, so that a context that fits is never refused:
per token and attention layer, K and V of head_count_kv heads at key_length and value_length (an MLA model:
its kv_lora_rank), in F16; layers without attention (recurrent, short-convolution) count only where the header
says which they are (head_count_kv per layer, full_attention_interval), else one layer; a sliding-window model
counts one layer at the whole context and the rest at the window. `-c 99999999999` used to run the whole
machine out of memory, and under a cap to be OOM-killed (exit 137) with no message."""

from __future__ import annotations

from pathlib import Path

from harness.engine.config import EngineConfig
from harness.engine.io import sysstats
from harness.engine.model.gguf_layout import ModelLayout, read_header
from harness.errors import UserError

MIB = 1 << 20
N_CTX_MAX = (1 << 32) - 1  # llama_context_params.n_ctx is a uint32_t
_KV_BYTES = 2  # F16 K and V, llama.cpp's default cache type
_UNSURE = ("deepseek4", "bailingmoe3")  # compressed or linear attention the bound below does not model


def _num(v: object, default: int = 0) -> int:
    """A header value that may be given per layer: its smallest (a lower bound)."""
    if isinstance(v, list):
        return min((int(x) for x in v), default=default)
    return int(v) if isinstance(v, int | float) else default


def kv_lower_bound(kv: dict[str, object], arch: str, n_layer: int, ctx: int) -> tuple[int, int]:
    """(bytes the KV cache takes at least at ctx tokens, attention layers counted)."""
    def g(key: str) -> object:
        return kv.get(f"{arch}.{key}")

    n_embd, n_head = _num(g("embedding_length")), _num(g("attention.head_count"))
    heads_kv = g("attention.head_count_kv")
    per_layer = [int(x) for x in heads_kv] if isinstance(heads_kv, list) else [_num(heads_kv, n_head)] * n_layer
    per_layer = (per_layer + [0] * n_layer)[:n_layer]
    head_dim = n_embd // n_head if n_head else 0
    k_len = _num(g("attention.key_length"), head_dim)
    v_len = _num(g("attention.value_length"), k_len)
    lora = _num(g("attention.kv_lora_rank"))
    layers = [il for il in range(n_layer) if per_layer[il] > 0]
    interval = _num(g("full_attention_interval"))
    hybrid = any(".ssm." in k or "shortconv" in k or "linear" in k for k in kv if k.startswith(f"{arch}."))
    if interval > 0:
        layers = [il for il in layers if (il + 1) % interval == 0]
    elif (hybrid and not isinstance(heads_kv, list)) or arch in _UNSURE:
        layers = layers[:1]
    per_token = [lora if lora else per_layer[il] * (k_len + v_len) for il in layers]
    window = _num(g("attention.sliding_window"))
    if window > 0 and per_token:
        total = max(per_token) * ctx + sum(sorted(per_token)[:-1]) * min(ctx, window)
    else:
        total = sum(per_token) * ctx
    return total * _KV_BYTES, len(layers)


def memory_room() -> tuple[float, str]:
    """(MiB this process may still fill, what limits it)."""
    mem = sysstats.memory_reading()
    room, what = mem.available_mib, "MemAvailable"
    if mem.cgroup_limit_bytes is not None and mem.cgroup_limit_bytes / MIB - mem.anon_mib < room:
        room, what = mem.cgroup_limit_bytes / MIB - mem.anon_mib, "the memory cgroup's limit"
    return max(room, 0.0), what


def check_context(cfg: EngineConfig, layout: ModelLayout) -> None:
    """One line, exit 2, when -c cannot be allocated here; nothing is allocated before."""
    h = read_header(Path(cfg.model), 0)
    trained = _num(h.kv.get(f"{layout.arch}.context_length"))
    told = f" (the model was trained for {trained})" if trained else ""
    if cfg.ctx > N_CTX_MAX:
        raise UserError(f"-c {cfg.ctx}: above llama.cpp's largest context ({N_CTX_MAX}); give a smaller -c{told}")
    need, n_att = kv_lower_bound(h.kv, layout.arch, layout.n_layer_trunk, cfg.ctx)
    room, what = memory_room()
    if need / MIB <= room:
        return
    per = need / cfg.ctx
    fits = int(room * MIB / per) if per else 0
    raise UserError(f"-c {cfg.ctx}: the KV cache alone needs at least {need / MIB:,.0f} MiB ({n_att} attention "
                    f"layers of {cfg.model}), and {room:,.0f} MiB are free here ({what}); give -c at most "
                    f"{max(fits, 0)}{told}")
