"""From the trained checkpoint to GGUF files (toolchain venv): the pinned converter (convert.py) to f16, then the
pinned `llama-quantize` to each quant; sha256 of every output; a tokenizer check file (held-out text and the ids the
HF tokenizer gives it) for the product's test that llama.cpp tokenizes the converted file the same way."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

QUANTS = ("Q8_0", "Q4_K_M")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(llama_src: Path, hf_dir: Path, out: Path, say) -> Path:
    f16 = out.with_name(out.stem + "-F16.gguf")
    if not f16.exists():
        tmp = f16.with_suffix(".part")
        cmd = [sys.executable, "-m", "harness.recipe.convert", str(llama_src), str(hf_dir), "--outfile", str(tmp),
               "--outtype", "f16"]
        say("convert: " + " ".join(cmd[2:]))
        subprocess.run(cmd, check=True)
        tmp.rename(f16)
    return f16


def quantize(quantize_bin: Path, f16: Path, quant: str, say) -> Path:
    out = f16.with_name(f16.name.replace("-F16.gguf", f"-{quant}.gguf"))
    if not out.exists():
        tmp = out.with_suffix(".part")
        say(f"quantize: {quantize_bin.name} {f16.name} {out.name} {quant}")
        r = subprocess.run([str(quantize_bin), str(f16), str(tmp), quant], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llama-quantize {quant} failed: {r.stderr.strip()[-500:]}")
        (out.parent / f"quantize-{quant}.log").write_text(r.stdout + r.stderr)
        tmp.rename(out)
    return out


def token_check(tokenizer, text: str, path: Path) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    path.write_text(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")


def heldout_sample(root: Path, rels: list[str], out: Path, n_files: int = 12, chars: int = 1500) -> None:
    """A small committed sample of the held-out side: the first `chars` characters (cut at a line end) of the first
    `n_files` held-out files in path order, as bmoe-prompts v1 lines (heldout-sample.prompts.jsonl: id = the file's
    path) and as one text (heldout-sample.txt, passages joined by blank lines), for the routing-realism traces and
    the quality campaigns' held-out scoring. Never text the model was trained on."""
    items = []
    for rel in sorted(rels)[:n_files]:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        cut = text.rfind("\n", 0, chars)
        items.append((rel, text[:cut if cut > chars // 2 else chars].strip()))
    head = json.dumps({"format": "bmoe-prompts", "version": 1}) + "\n"
    (out / "heldout-sample.prompts.jsonl").write_text(
        head + "".join(json.dumps({"id": rel, "prompt": t}, ensure_ascii=False) + "\n" for rel, t in items),
        encoding="utf-8")
    (out / "heldout-sample.txt").write_text("\n\n".join(t for _, t in items) + "\n", encoding="utf-8")
