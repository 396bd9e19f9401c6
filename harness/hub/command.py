"""`bmoe pull org/repo[:QUANT|/file.gguf] [--revision REV]`, and `-hf org/repo[:QUANT]` in place of `-m` on `bmoe`,
`bmoe chat` and `bmoe serve`: the model pulled (or found in the cache), then the command line given `-m` with the
local file. The pull prints its one progress bar and summary on stderr; `bmoe pull` prints the model's path on stdout
(the first shard of a split model), so `bmoe -m "$(bmoe pull org/repo)"` works."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

from harness.errors import UserError
from harness.hub.pull import Pulled, pull
from harness.hub.remote import HubSettings
from harness.hub.spec import parse_ref

HF_FLAGS = ("-hf", "--hf")
PULL_HELP = ("bmoe pull org/repo[:QUANT|/file.gguf] [--revision REV]: download a GGUF model (every shard of a split "
             "one) from Hugging Face into its cache (HF_HOME; a model already there is reused), each file's sha256 "
             "checked; prints the model's path. QUANT as llama.cpp's -hf (default Q4_K_M, then Q8_0, then the first "
             "GGUF); HF_TOKEN or `huggingface-cli login` for gated or private repos; HF_ENDPOINT for another hub; "
             "HF_HUB_OFFLINE=1 to use only the cache")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UserError(f"bmoe pull: {message} (see bmoe pull --help)")


def _bar(err: TextIO):
    @contextlib.contextmanager
    def bar(total: int, label: str) -> Iterator:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        console = Console(file=err)
        cols = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
        with Progress("[progress.description]{task.description}", *cols, console=console,
                      disable=not console.is_terminal) as p:
            task = p.add_task(label, total=total)
            yield lambda n: p.advance(task, n)

    return bar


def summary(got: Pulled, spec: str) -> str:
    size = sum(f.size for f in got.files)
    what = got.files[0].name + (f" and {len(got.files) - 1} more shard(s)" if len(got.files) > 1 else "")
    how = f"downloaded {got.fetched / 2**20:.1f} MiB" if got.fetched else "already in the cache"
    return (f"bmoe: {spec} -> {what} at {got.repo}@{got.commit[:12]} ({size / 2**20:.1f} MiB, {how}; every file's "
            f"hash checked against the hub's)")


def pull_ref(spec: str, revision: str, env: Mapping[str, str], err: TextIO) -> Pulled:
    ref = parse_ref(spec, revision)
    got = pull(ref, HubSettings.from_env(env), _bar(err))
    err.write(summary(got, spec) + "\n")
    err.flush()
    return got


def pull_main(argv: list[str], env: Mapping[str, str] = os.environ, out: TextIO | None = None,
              err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    if any(a in ("-h", "--help") for a in argv):
        out.write(PULL_HELP + "\n")
        return 0
    p = _Parser(prog="bmoe pull", add_help=False, allow_abbrev=False)
    p.add_argument("spec")
    p.add_argument("--revision", default="main")
    ns = p.parse_args(argv)
    got = pull_ref(ns.spec, ns.revision, env, err)
    out.write(f"{got.path}\n")
    out.flush()
    return 0


def hf_spec(argv: list[str]) -> tuple[str | None, list[str]]:
    """The `-hf SPEC` of an engine command line (None: none) and the line without it."""
    spec, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        val = None
        if a in HF_FLAGS:
            if i + 1 >= len(argv):
                raise UserError(f"bmoe: {a} needs org/repo[:QUANT]")
            val, i = argv[i + 1], i + 2
        elif a.startswith(tuple(f"{f}=" for f in HF_FLAGS)):
            val, i = a.split("=", 1)[1], i + 1
        else:
            rest.append(a)
            i += 1
            continue
        if spec is not None:
            raise UserError("bmoe: -hf is given twice; give one model")
        spec = val
    return spec, rest


def has_model(argv: list[str]) -> bool:
    return any(a in ("-m", "--model") or a.startswith("--model=") or (a.startswith("-m") and not a.startswith("--")
                                                                      and len(a) > 2) for a in argv)


def rewrite_hf(argv: list[str], env: Mapping[str, str] = os.environ, err: TextIO | None = None) -> list[str]:
    """An engine command line with `-hf SPEC` pulled and given as `-m PATH` (unchanged without -hf)."""
    spec, rest = hf_spec(argv)
    if spec is None:
        return argv
    if has_model(rest):
        raise UserError("bmoe: give -m (a local file) or -hf (a hub model), not both")
    got = pull_ref(spec, "main", env, err or sys.stderr)
    if rest and rest[0] in ("chat", "serve"):  # the subcommand stays first
        return [rest[0], "-m", str(got.path), *rest[1:]]
    return ["-m", str(got.path), *rest]
