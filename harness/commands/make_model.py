"""`bmoe-bench make-model`: write a seeded synthetic GGUF MoE model (harness.synth)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import get_type_hints

import typer

from harness.formats.model_fields import ModelFields, flag_fields, meta
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


# the help of the flags whose choices come from the synth package (the others' is declared with their field)
_HELP = {
    "arch": f"qwen3moe, qwen2moe, gpt-oss (MXFP4 experts, harmony template), qwen3 (dense), olmoe, "
            f"{', '.join(archs.names())}.",
    "chat_template": f"Chat template to carry: {', '.join(TEMPLATES)} (none: no template); default harmony for "
                     "gpt-oss, else chatml. qwen3 adds its <think> tokens to the vocab.",
}


def _model_options() -> list[inspect.Parameter]:
    """One option per model field that has a make-model flag (harness.formats.model_fields declares them), named
    as the field: unset (None) keeps the shape's value."""
    hints = get_type_hints(ModelFields)
    return [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[f.name] | None,
                              default=typer.Option(None, meta(f).flag, help=_HELP.get(f.name, meta(f).help)))
            for f in flag_fields()]


def _with_model_options(cmd):
    """typer reads a command's options from its signature: the model's go between --shape and --progress, and
    reach the command as keyword arguments named as their fields."""
    own = inspect.signature(cmd).parameters
    cmd.__signature__ = inspect.Signature(
        [own["out"], own["shape"], *_model_options(), own["progress"], own["force"], own["dry_run"]])
    return cmd


@_with_model_options
def make_model_cmd(
    out: Path = typer.Argument(
        ..., help="Output path, e.g. model.gguf; with --split N: model-0000i-of-0000N.gguf."
    ),
    shape: str = typer.Option(
        "tiny", "--shape", help=f"Named shape: {', '.join(SHAPES)}. Flags below override it."
    ),
    progress: bool = typer.Option(False, "--progress", help="Show a progress bar on stderr."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan's size and files, write nothing."),
    **fields: object,
) -> None:
    """Write a seeded, deterministic synthetic MoE GGUF (byte-level tokenizer; ChatML template, harmony for
    gpt-oss)."""
    spec = shape_spec(shape, **fields)
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
