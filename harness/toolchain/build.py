"""Build, convert and quantize the tiny checkpoints (toolchain venv):

    python -m harness.toolchain.build OUT_DIR --llama-src SRC --quantize LLAMA_QUANTIZE [--only NAME ...]

For each family (families.py): a tokenizer (tokenizers.py), transformers' own config and class, seeded random init,
`save_pretrained` (safetensors) into OUT_DIR/hf/<name>; the pinned converter (harness.recipe.convert: the
converter's own main, with one pre-tokenizer registration) to OUT_DIR/<name>-F16.gguf; the pinned llama-quantize to
each of QUANTS. One family is also converted into SPLIT_SHARDS shards (the converter's --split-max-tensors, llama.cpp's
name-0000i-of-0000n.gguf naming) and quantized with --keep-split. OUT_DIR/models.json lists every file with its
sha256, the stamp of the inputs (these sources, the tools' build) and each step's seconds; a second run with the same
stamp does nothing."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness.recipe.export import sha256
from harness.toolchain.families import FAMILIES, Family

QUANTS = ("Q8_0", "Q4_K_M", "IQ4_XS")
SPLIT_FAMILY, SPLIT_QUANT, SPLIT_SHARDS = "qwen3moe", "Q8_0", 3
MANIFEST = "models.json"  # OUT_DIR's list of every file (its own format: not a campaign folder's manifest)
# --publish: family -> whether its SPLIT_QUANT goes as shards (the whole file otherwise)
PUBLISH: dict[str, bool] = {"olmoe": False, SPLIT_FAMILY: True}


def stamp(llama_src: Path, quantize_bin: Path) -> str:
    """The inputs' identity: the sources that make the files, the converter's entry file and the quantizer binary."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for p in [here / n for n in ("build.py", "families.py", "tokenizers.py", "tokenization_tiny_hy.py")] + [
            here.parent / "recipe" / "convert.py", llama_src / "convert_hf_to_gguf.py", quantize_bin]:
        h.update(p.name.encode() + sha256(p).encode())
    return h.hexdigest()[:16]


def checkpoint(fam: Family, hf_dir: Path) -> None:
    """transformers' own config and class, seeded, saved as safetensors with its tokenizer."""
    import torch
    import transformers

    from harness.toolchain import tokenizers

    hf_dir.mkdir(parents=True, exist_ok=True)
    if fam.tokenizer == "spm":
        vocab = tokenizers.train_spm(hf_dir)
        ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=None)
    else:
        vocab = (tokenizers.train_hy if fam.tokenizer == "hy" else tokenizers.train_bpe)(hf_dir)
        ids = dict(bos_token_id=None, eos_token_id=0, pad_token_id=0)
    config = getattr(transformers, fam.config)(vocab_size=vocab, **ids, **fam.kwargs)
    torch.manual_seed(fam.seed)
    model = getattr(transformers, fam.model)(config).eval()
    model.save_pretrained(str(hf_dir), safe_serialization=True)


# text the tokenizer check encodes: words of the training text and others, digits, punctuation, a non-ASCII word
TOKCHECK = "The expert cache keeps hot experts near. Routers pick 2 of 32 experts, 128 wide; naïve readers wait!"


def token_ids(fam: Family, hf_dir: Path) -> list[int]:
    """TOKCHECK's ids by the checkpoint's own tokenizer (transformers), for the test that llama.cpp agrees."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=fam.tokenizer == "hy")
    return list(tok(TOKCHECK, add_special_tokens=False)["input_ids"])


def convert(llama_src: Path, hf_dir: Path, out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "harness.recipe.convert", str(llama_src), str(hf_dir), "--outfile", str(out),
           "--outtype", "f16", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert {hf_dir.name} failed:\n{r.stderr[-3000:]}")
    (out.parent / "logs").mkdir(exist_ok=True)
    (out.parent / "logs" / f"{out.stem}.convert.log").write_text(r.stdout + r.stderr)


def quantize(quantize_bin: Path, src: Path, out: Path, quant: str, *extra: str) -> str:
    r = subprocess.run([str(quantize_bin), *extra, str(src), str(out), quant], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize {src.name} {quant} failed:\n{r.stderr[-3000:]}")
    (out.parent / "logs").mkdir(exist_ok=True)
    log = r.stdout + r.stderr
    (out.parent / "logs" / f"{out.stem}.quantize.log").write_text(log)
    return log


_FALLBACK = re.compile(r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by (\d+) \(required for type\s+(\w+)\)"
                       r" -> falling back to\s+(\w+)")


def fallbacks(log: str) -> dict[str, str]:
    """The tensors llama-quantize gave another type than its mix asked (rows no multiple of the type's block):
    name -> 'asked->written', from its warning lines."""
    return {m[1]: f"{m[4]}->{m[5]}" for m in _FALLBACK.finditer(log)}


def build_family(fam: Family, out: Path, llama_src: Path, quantize_bin: Path) -> dict:
    t0 = time.monotonic()
    hf_dir = out / "hf" / fam.name
    checkpoint(fam, hf_dir)
    t1 = time.monotonic()
    f16 = out / f"{fam.name}-F16.gguf"
    convert(llama_src, hf_dir, f16, *fam.convert_args)
    t2 = time.monotonic()
    files = {"F16": f16.name}
    fb: dict[str, dict[str, str]] = {}
    for q in QUANTS:
        dst = out / f"{fam.name}-{q}.gguf"
        fb[q] = fallbacks(quantize(quantize_bin, f16, dst, q))
        files[q] = dst.name
    entry = {"arch": fam.arch, "config": fam.config, "model": fam.model, "seed": fam.seed,
             "tokenizer": fam.tokenizer, "files": files, "fallback_tensors": fb,
             "tokcheck": {"text": TOKCHECK, "ids": token_ids(fam, hf_dir)},
             "seconds": {"checkpoint": round(t1 - t0, 2), "convert": round(t2 - t1, 2),
                         "quantize": round(time.monotonic() - t2, 2)}}
    if fam.name == SPLIT_FAMILY:
        entry["split"] = split(fam, out, hf_dir, llama_src, quantize_bin)
    return entry


def split(fam: Family, out: Path, hf_dir: Path, llama_src: Path, quantize_bin: Path) -> dict:
    """The same checkpoint converted into SPLIT_SHARDS shards and quantized shard by shard (--keep-split)."""
    sys.path.insert(0, str(llama_src / "gguf-py"))  # the converter's own gguf-py (the toolchain venv has no gguf)
    from gguf import GGUFReader

    n_tensors = len(GGUFReader(out / f"{fam.name}-F16.gguf").tensors)
    per = -(-n_tensors // SPLIT_SHARDS)
    d = out / "split"
    d.mkdir(exist_ok=True)
    convert(llama_src, hf_dir, d / f"{fam.name}-F16.gguf", *fam.convert_args, "--split-max-tensors", str(per))
    f16 = sorted(d.glob(f"{fam.name}-F16-*-of-*.gguf"))
    assert len(f16) == SPLIT_SHARDS, f"the converter wrote {len(f16)} shards, not {SPLIT_SHARDS}"
    quantize(quantize_bin, f16[0], d / f"{fam.name}-{SPLIT_QUANT}.gguf", SPLIT_QUANT, "--keep-split")
    shards = sorted(d.glob(f"{fam.name}-{SPLIT_QUANT}-*-of-*.gguf"))
    assert len(shards) == SPLIT_SHARDS, f"llama-quantize wrote {len(shards)} shards, not {SPLIT_SHARDS}"
    return {"quant": SPLIT_QUANT, "f16": [f"split/{p.name}" for p in f16], "files": [f"split/{p.name}" for p in shards]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.toolchain.build")
    ap.add_argument("out", type=Path)
    ap.add_argument("--llama-src", type=Path, required=True, help="the pinned converter's folder")
    ap.add_argument("--quantize", type=Path, required=True, help="the pinned llama-quantize")
    ap.add_argument("--only", nargs="*", default=None, help="these families only (default: all)")
    ap.add_argument("--publish", type=Path, default=None, help="copy PUBLISH's families' files here as hub repos")
    a = ap.parse_args(argv)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = a.only or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        print(f"real-toolchain: unknown families {unknown}; known: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    st = stamp(a.llama_src.resolve(), a.quantize.resolve())
    mpath = out / MANIFEST
    old = json.loads(mpath.read_text()) if mpath.exists() else {}
    fams = old.get("families", {}) if old.get("stamp") == st else {}
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    failed: list[str] = []
    for name in names:
        if name in fams and fams[name]["files"] and all((out / f).exists() for f in fams[name]["files"].values()):
            continue
        t = time.monotonic()
        try:
            fams[name] = build_family(FAMILIES[name], out, a.llama_src.resolve(), a.quantize.resolve())
        except (RuntimeError, AssertionError, ValueError, KeyError) as e:  # recorded; the other families go on
            fams[name] = {"arch": FAMILIES[name].arch, "files": {}, "error": str(e)[-2000:]}
            failed.append(name)
            print(f"real-toolchain: {name} FAILED: {str(e)[-600:]}", file=sys.stderr)
            continue
        print(f"real-toolchain: {name} in {time.monotonic() - t:.1f} s", file=sys.stderr)
        for f in list(fams[name]["files"].values()) + fams[name].get("split", {}).get("files", []):
            fams[name].setdefault("sha256", {})[f] = sha256(out / f)
        mpath.write_text(json.dumps({"schema": "bmoe-real-toolchain v1", "stamp": st, "families": fams},
                                    indent=1) + "\n")
    if a.publish is not None:
        publish(out, fams, a.publish.resolve())
    return 1 if failed else 0


def publish(out: Path, fams: dict, dest: Path) -> None:
    """PUBLISH's families as hub repositories: DEST/tiny-<family>-GGUF/<family>-<QUANT>.gguf (a split quant's shards
    under their own names), each with a README naming how they were made; a file already there with the same bytes is
    left alone."""
    import shutil

    for name, split_only in PUBLISH.items():
        if name not in fams:
            continue
        e = fams[name]
        repo = dest / f"tiny-{name}-GGUF"
        repo.mkdir(parents=True, exist_ok=True)
        files = list(e.get("split", {}).get("files", [])) if split_only else []
        files += [f for q, f in e["files"].items() if q != "F16" and not (split_only and q == SPLIT_QUANT)]
        for f in files:
            dst = repo / Path(f).name
            if not (dst.exists() and sha256(dst) == e["sha256"][f]):
                shutil.copyfile(out / f, dst)
        (repo / "README.md").write_text(
            f"# tiny-{name}-GGUF\n\nA seeded random-init {e['model']} (transformers {e['config']}, seed {e['seed']}),"
            " converted by the pinned llama.cpp's convert_hf_to_gguf.py and quantized by its llama-quantize"
            " (scripts/real-toolchain-models.sh in bmoe). Random weights: its text means nothing.\n")
        print(f"real-toolchain: published {len(files)} files to {repo}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
