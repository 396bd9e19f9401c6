"""`bmoe-bench make-model`: write a seeded synthetic GGUF MoE model (harness.synth)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.synth import archs, make_model, plan_model
from harness.synth.shapes import SHAPES, shape_spec
from harness.synth.tokenizer import TEMPLATES
from harness.synth.writer import check_outputs


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError


def make_model_cmd(
    out: Path = typer.Argument(
        ..., help="Output path, e.g. model.gguf; with --split N: model-0000i-of-0000N.gguf."
    ),
    shape: str = typer.Option(
        "tiny", "--shape", help=f"Named shape: {', '.join(SHAPES)}. Flags below override it."
    ),
    arch: str | None = typer.Option(
        None, "--arch", help=f"qwen3moe, qwen2moe, gpt-oss (MXFP4 experts, harmony template), qwen3 (dense), olmoe, "
        f"{', '.join(archs.names())}."
    ),
    layers: int | None = typer.Option(None, "--layers", help="Number of layers."),
    experts: int | None = typer.Option(None, "--experts", help="Routed experts per layer."),
    top_k: int | None = typer.Option(None, "--top-k", help="Experts used per token."),
    embd: int | None = typer.Option(None, "--embd", help="Embedding width."),
    expert_ff: int | None = typer.Option(None, "--expert-ff", help="Expert FFN width."),
    shared_ff: int | None = typer.Option(None, "--shared-ff", help="Shared expert width (qwen2moe)."),
    dense_ff: int | None = typer.Option(None, "--dense-ff", help="FFN width of the dense arch (qwen3)."),
    heads: int | None = typer.Option(None, "--heads", help="Attention heads."),
    heads_kv: int | None = typer.Option(None, "--heads-kv", help="KV heads."),
    head_dim: int | None = typer.Option(None, "--head-dim", help="Head dimension."),
    vocab: int | None = typer.Option(None, "--vocab", help="Vocabulary size (>= 261; byte-level)."),
    ctx: int | None = typer.Option(None, "--ctx", help="Training context length written to the metadata."),
    expert_type: str | None = typer.Option(
        None, "--expert-type", help="f32, q8_0, q4_k, mxfp4 or q5_0 (default: q4_k; mxfp4 for gpt-oss); iq2_s for "
        "--dry-run sizing only."
    ),
    dense_type: str | None = typer.Option(
        None, "--dense-type", help="f32, f16 or q8_0 (attention, embeddings)."
    ),
    chat_template: str | None = typer.Option(
        None, "--chat-template",
        help=f"Chat template to carry: {', '.join(TEMPLATES)} (none: no template); default harmony for gpt-oss, "
        "else chatml. qwen3 adds its <think> tokens to the vocab.",
    ),
    swa: int | None = typer.Option(None, "--swa", help="Sliding-window size (gpt-oss; default 128)."),
    seed: int | None = typer.Option(None, "--seed", help="Seed; same flags and seed give identical bytes."),
    split: int | None = typer.Option(None, "--split", help="Number of shards."),
    progress: bool = typer.Option(False, "--progress", help="Show a progress bar on stderr."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan's size and files, write nothing."),
) -> None:
    """Write a seeded, deterministic synthetic MoE GGUF (byte-level tokenizer; ChatML template, harmony for
    gpt-oss)."""
    spec = shape_spec(
        shape,
        arch=arch,
        n_layer=layers,
        n_expert=experts,
        n_expert_used=top_k,
        n_embd=embd,
        n_ff_exp=expert_ff,
        n_ff_shexp=shared_ff,
        n_ff=dense_ff,
        n_head=heads,
        n_head_kv=heads_kv,
        head_dim=head_dim,
        n_vocab=vocab,
        ctx_len=ctx,
        expert_type=expert_type,
        dense_type=dense_type,
        n_swa=swa,
        chat_template=chat_template,
        seed=seed,
        n_split=split,
    )
    plan = plan_model(spec)
    if dry_run:
        paths = check_outputs(out, spec.n_split, force=True)
        sizes = plan.shard_sizes
    else:
        paths = make_model(out, spec, progress=progress, force=force)
        sizes = tuple(p.stat().st_size for p in paths)
    for p, n in zip(paths, sizes, strict=True):
        typer.echo(f"{p}\t{n}")
    verb = "would write" if dry_run else "wrote"
    typer.echo(
        f"{verb} {len(paths)} file(s), {sum(sizes)} bytes ({_human(sum(sizes))}, {sum(sizes) / 1e9:.2f} GB): "
        f"{spec.arch}, "
        f"{spec.n_layer} layers, {spec.n_expert} experts top-{spec.n_expert_used}, "
        f"{spec.expert_type} experts",
        err=True,
    )


def register(app: typer.Typer) -> None:
    app.command("make-model")(make_model_cmd)
