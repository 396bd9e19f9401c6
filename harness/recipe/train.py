"""The training loop (toolchain venv): transformers' own Qwen3MoeForCausalLM, its router load-balancing loss on
(output_router_logits, router_aux_loss_coef: the loss it adds to the LM loss when labels are given, as real
Qwen3-MoE training does), AdamW with warm-up and cosine decay, seeded batches (step s draws its windows from
numpy's generator seeded with (seed, s), so a resumed run draws what an unbroken one would).

A checkpoint (model, optimizer, step) is written atomically every `ckpt_every` steps; a run that finds one resumes
from it, and the loss log drops rows past it. Progress: a tqdm bar with the loss."""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from harness.recipe.sizes import Size

LOG_FIELDS = ["step", "tokens", "loss", "ce", "aux", "lr", "elapsed_s", "heldout_ce"]


def build(size: Size, seed: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, head_dim=size.head_dim,
        intermediate_size=size.expert_ff * size.top_k,  # unused: every layer is sparse (mlp_only_layers empty)
        moe_intermediate_size=size.expert_ff, num_experts=size.experts, num_experts_per_tok=size.top_k,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, output_router_logits=True,
        router_aux_loss_coef=size.aux_coef, tie_word_embeddings=False, max_position_embeddings=4096,
        rope_theta=10000.0, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    model = Qwen3MoeForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    if n != size.params()["total"]:
        raise RuntimeError(f"model has {n} parameters, sizes.py says {size.params()['total']}")
    return model


def lr_at(size: Size, step: int) -> float:
    if step < size.warmup:
        return size.lr * (step + 1) / size.warmup
    frac = (step - size.warmup) / max(1, size.steps - size.warmup)
    return size.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def batch(stream: np.ndarray, size: Size, seed: int, step: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, stream.size - size.seq_len - 1, size.batch)
    return torch.from_numpy(np.stack([stream[s:s + size.seq_len].astype(np.int64) for s in starts]))


@torch.no_grad()
def heldout_ce(model, stream: np.ndarray, seq_len: int, max_tokens: int) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over non-overlapping windows of the held-out stream, up to max_tokens."""
    model.eval()
    total, count = 0.0, 0
    n_win = min(stream.size // seq_len, max(1, max_tokens // seq_len))
    for i in range(0, n_win, 8):
        x = torch.from_numpy(np.stack([stream[w * seq_len:(w + 1) * seq_len].astype(np.int64)
                                       for w in range(i, min(n_win, i + 8))]))
        logits = model(input_ids=x, output_router_logits=False).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        total += float(loss)
        count += x[:, 1:].numel()
    model.train()
    return total / count, count


def logged_seconds(log: Path) -> float:
    rows = list(csv.DictReader(log.open())) if log.exists() else []
    return float(rows[-1]["elapsed_s"]) if rows else 0.0


def _save(path: Path, model, opt, step: int) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def _trim_log(log: Path, upto: int) -> None:
    if not log.exists():
        return
    rows = [r for r in csv.DictReader(log.open()) if int(r["step"]) <= upto]
    with log.open("w", newline="") as f:
        w = csv.DictWriter(f, LOG_FIELDS)
        w.writeheader()
        w.writerows(rows)


def run(size: Size, seed: int, work: Path, train_ids: np.ndarray, held_ids: np.ndarray, say) -> object:
    torch.set_num_threads(int(os.environ.get("BMOE_TRAIN_THREADS", "2")))
    model = build(size, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    ckpt, log = work / "checkpoint.pt", work / "loss.csv"
    start, elapsed0 = 0, 0.0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        _trim_log(log, start)
        rows = list(csv.DictReader(log.open())) if log.exists() else []
        elapsed0 = float(rows[-1]["elapsed_s"]) if rows else 0.0
        say(f"resuming at step {start} of {size.steps}")
    if not log.exists():
        with log.open("w", newline="") as f:
            csv.DictWriter(f, LOG_FIELDS).writeheader()
    model.train()
    t0 = time.monotonic()
    bar = tqdm(total=size.steps, initial=start, desc=f"train {size.name}", unit="step", dynamic_ncols=True)
    for step in range(start, size.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(size, step)
        x = batch(train_ids, size, seed, step)
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        aux = float(out.aux_loss)
        loss = float(out.loss)
        done = step + 1
        he = ""
        if done % size.eval_every == 0 or done == size.steps:
            he = f"{heldout_ce(model, held_ids, size.seq_len, 16384)[0]:.4f}"
        with log.open("a", newline="") as f:
            csv.DictWriter(f, LOG_FIELDS).writerow({
                "step": done, "tokens": done * size.batch * size.seq_len, "loss": f"{loss:.4f}",
                "ce": f"{loss - size.aux_coef * aux:.4f}", "aux": f"{aux:.4f}", "lr": f"{lr_at(size, step):.6g}",
                "elapsed_s": f"{elapsed0 + time.monotonic() - t0:.1f}", "heldout_ce": he})
        bar.set_postfix(loss=f"{loss:.3f}", aux=f"{aux:.3f}")
        bar.update(1)
        if done % size.ckpt_every == 0 or done == size.steps:
            _save(ckpt, model, opt, done)
    bar.close()
    return model
