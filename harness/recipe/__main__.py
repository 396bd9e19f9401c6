"""`python -m harness.recipe --size tiny|bench --work DIR --out DIR [--seed N]` (toolchain venv; scripts/train-model.sh
sets it up and runs this). Resumable: every stage keeps its output in --work and is skipped when it is there."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.recipe")
    ap.add_argument("--size", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="override the size's step count (a smoke run; recorded)")
    a = ap.parse_args(argv)
    from harness.recipe import sizes
    try:
        size = sizes.get(a.size)
    except KeyError as e:
        print(f"recipe: {e.args[0]}", file=sys.stderr)
        return 2
    if a.steps > 0:
        import dataclasses
        size = dataclasses.replace(size, steps=a.steps, warmup=min(size.warmup, a.steps),
                                   ckpt_every=min(size.ckpt_every, a.steps), eval_every=min(size.eval_every, a.steps))
    llama_src = Path(os.environ["BMOE_LLAMA_SRC"])
    quantize_bin = Path(os.environ["BMOE_LLAMA_QUANTIZE"])
    work, out = a.work.resolve(), a.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log_path = work / "train.log"
    log = log_path.open("a")

    def say(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}"
        print(line, file=sys.stderr, flush=True)
        log.write(line + "\n")
        log.flush()

    import numpy as np
    import torch
    import transformers

    from harness.recipe import card, corpus, data, export, tok, train
    t_all = time.monotonic()
    say(f"recipe {size.name} seed {a.seed}: {json.dumps(size.as_dict())}")
    say(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
        f"threads {os.environ.get('BMOE_TRAIN_THREADS', '2')}, cpu {platform.processor() or platform.machine()}")
    root, versions, deb_hashes = corpus.fetch(work)
    files = corpus.list_files(root)
    tr_files, he_files = corpus.split(files)
    key = corpus.corpus_hash(files, versions)
    say(f"corpus {key}: {len(tr_files)} train files ({sum(f.size for f in tr_files)} bytes), {len(he_files)} "
        f"held-out files ({sum(f.size for f in he_files)} bytes); packages {versions}")
    hf = work / "hf"
    if not (hf / "tokenizer.json").exists():
        t = time.monotonic()
        tok.train(iter(data.documents(root, tr_files, a.seed, chat=True)), size.vocab, hf)
        say(f"tokenizer: byte-level BPE, {size.vocab} tokens, trained in {time.monotonic() - t:.0f} s")
    train_ids, held_ids, counts = data.streams(work, root, tr_files, he_files, hf, a.seed, key)
    say(f"tokens: {counts}")
    t_train = time.monotonic()
    model = train.run(size, a.seed, work, train_ids, held_ids, say)
    train_s = time.monotonic() - t_train
    train_s = max(train_s, train.logged_seconds(work / "loss.csv"))  # a resumed run: the log holds all segments
    ce, n_tok = train.heldout_ce(model, held_ids, size.seq_len, 1 << 30)
    say(f"held-out: cross-entropy {ce:.4f} nats over {n_tok} tokens, perplexity {math.exp(ce):.2f}")
    model.config.output_router_logits = False
    model.save_pretrained(str(hf), safe_serialization=True)
    stem = out / f"bmoe-{size.name}"
    f16 = export.convert(llama_src, hf, stem.with_suffix(".gguf"), say)
    ggufs = [export.quantize(quantize_bin, f16, q, say) for q in export.QUANTS]
    tokenizer = tok.load(hf)
    sample = (root / he_files[0].rel).read_text(encoding="utf-8")[:3000]
    export.token_check(tokenizer, sample, out / "tokcheck.json")
    export.heldout_sample(root, [f.rel for f in he_files], out)
    shutil.copy(work / "loss.csv", out / "loss.csv")
    shutil.copy(work / "train.log", out / "train.log")
    (out / "LICENSE.corpus").write_text("".join(
        f"===== {p} =====\n{(root / p).read_text(encoding='utf-8', errors='replace')}\n" for p in corpus.LICENSE_FILES))
    recipe = {
        "size": size.as_dict(), "seed": a.seed, "params": size.params(),
        "corpus": {"sha256": key, "packages": versions, "deb_sha256": deb_hashes, "license": "PSF-2.0",
                   "train_files": len(tr_files), "heldout_files": [f.rel for f in he_files], **counts},
        "heldout": {"cross_entropy_nats": round(ce, 4), "perplexity": round(math.exp(ce), 3), "tokens": n_tok},
        "wall_s": {"train": round(train_s, 1), "total": round(max(time.monotonic() - t_all, _logged_span(log_path)), 1),
                   "note": "total: from the work folder's first log line to now, every resumed invocation and any "
                           "wait between them included"},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "numpy": np.__version__, "llama_src": str(llama_src)},
        "files": {p.name: export.sha256(p) for p in [f16, *ggufs]},
    }
    (out / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
    (out / "README.md").write_text(card.render(recipe))
    plot_loss(work / "loss.csv", out / "loss.png", size.name)
    say(f"done: {', '.join(p.name for p in ggufs)} in {out}")
    return 0


def _logged_span(log_path: Path) -> float:
    """Seconds from the log's first timestamp to now (the recipe's wall time across resumed invocations)."""
    import datetime as dt
    try:
        first = log_path.read_text().split(" ", 1)[0]
        t0 = dt.datetime.strptime(first, "%Y-%m-%dT%H:%M:%S")
    except (OSError, ValueError):
        return 0.0
    return (dt.datetime.now() - t0).total_seconds()


def plot_loss(csv_path: Path, png: Path, name: str) -> None:
    import csv

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(csv.DictReader(csv_path.open()))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([int(r["tokens"]) / 1e6 for r in rows], [float(r["ce"]) for r in rows], lw=0.8, label="training (batch)")
    he = [r for r in rows if r["heldout_ce"]]
    ax.plot([int(r["tokens"]) / 1e6 for r in he], [float(r["heldout_ce"]) for r in he], "o-", label="held-out")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"bmoe-{name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
