"""Write a planned model to disk: each shard's header first, then its tensors' data chunk by chunk, so
memory stays bounded by one chunk whatever the model size. Files get their final names only when complete."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.errors import UserError
from harness.formats.files import disk_full, is_disk_full, not_writable
from harness.synth.fill import tensor_chunks
from harness.synth.gguf_encode import align
from harness.synth.plan import ModelPlan, plan_model, shard_paths
from harness.synth.prefetch import prefetch
from harness.synth.spec import SIZING_ONLY, ModelSpec

ProgressFn = Callable[[int], None]  # called with the number of bytes just written


def check_outputs(out: Path, n_split: int, force: bool) -> list[Path]:
    """The shard paths; refuse to overwrite without force, or to write into a missing directory."""
    paths = shard_paths(out, n_split)
    if not out.parent.is_dir():
        raise UserError(f"output directory {out.parent} does not exist: create it or pick another OUT path")
    for p in paths:
        if p.exists() and not p.is_file():  # /dev/full, a FIFO: the .part beside it would land in /dev
            raise UserError(f"{p} is not a regular file: give a file path for the model")
        if p.exists() and not force:
            raise UserError(f"{p} already exists: pass --force to overwrite it")
    return paths


def _shard_chunks(
    plan: ModelPlan, tensors: tuple[int, ...], offsets: tuple[int, ...], seed: int
) -> Iterator[tuple[int, int, bytes]]:
    """(tensor index, tensor offset, bytes) for every chunk of the shard's tensors, in file order."""
    for i, off in zip(tensors, offsets, strict=True):
        t = plan.tensors[i]
        n = 0
        for chunk in tensor_chunks(t, seed):
            yield i, off, chunk
            n += len(chunk)
        if n != t.nbytes:
            raise RuntimeError(f"{t.name}: generated {n} bytes, planned {t.nbytes}")


def write_plan(plan: ModelPlan, paths: list[Path], on_bytes: ProgressFn | None = None) -> None:
    seed = plan.spec.seed
    for shard, path in zip(plan.shards, paths, strict=True):
        tmp = path.with_name(path.name + ".part")
        try:
            with open(tmp, "wb") as f:
                f.write(shard.header)
                pos, cur = 0, -1
                for i, off, chunk in prefetch(_shard_chunks(plan, shard.tensors, shard.offsets, seed)):
                    if i != cur:  # first chunk of a tensor: pad up to its aligned offset
                        f.write(b"\0" * (off - pos))
                        pos, cur = off, i
                    f.write(chunk)
                    pos += len(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
                f.write(b"\0" * (align(pos) - pos))
            os.replace(tmp, path)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            if is_disk_full(e):  # one line naming the file, what it needed and the space left
                raise disk_full(path, plan.shard_sizes[shard.index], "free some space there or write elsewhere") \
                    from None
            if isinstance(e, OSError) and (denied := not_writable(path, e)) is not None:
                raise denied from None
            raise


def make_model(out: Path, spec: ModelSpec, progress: bool = False, force: bool = True) -> list[Path]:
    """Write the synthetic model `spec` to `out` (one file, or n_split shards named after it); return the
    written paths. Same spec -> byte-identical files."""
    plan = plan_model(spec)
    unwritable = sorted({t.dtype for t in plan.tensors if t.dtype in SIZING_ONLY
                         or (t.init == "normal" and t.dtype not in ("f32", "f16", "q8_0"))})
    if unwritable:
        raise UserError(f"this model's {', '.join(unwritable)} tensors can be sized (make-model --dry-run) but "
                        "not generated; pick other --expert-type/--dense-type to write it")
    paths = check_outputs(Path(out), spec.n_split, force)
    if not progress:
        write_plan(plan, paths)
        return paths
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    cols = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress("[progress.description]{task.description}", *cols, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"writing {paths[0].name}", total=plan.total_bytes)
        write_plan(plan, paths, lambda n: bar.advance(task, n))
    return paths
