"""The model card (README.md beside the GGUF files) rendered from recipe.json: what the model is, how it was made,
its corpus and licence, its held-out perplexity, the wall time, and every file's sha256. Pure: dict in, text out."""

from __future__ import annotations


def render(r: dict) -> str:
    s, c, h = r["size"], r["corpus"], r["heldout"]
    files = "\n".join(f"| `{name}` | `{sha}` |" for name, sha in r["files"].items())
    pkgs = ", ".join(f"{p} {v}" for p, v in c["packages"].items())
    return f"""# bmoe-{s['name']}: a Qwen3-MoE trained here

A {r['params']['total'] / 1e6:.1f}M-parameter Mixture-of-Experts model ({s['layers']} layers, {s['experts']} experts
per layer, top-{s['top_k']}, hidden {s['hidden']}, expert FFN {s['expert_ff']}, {s['vocab']}-token byte-level BPE),
trained by `scripts/train-model.sh {s['name']}` (seed {r['seed']}) on 2 CPU cores with transformers' own
`Qwen3MoeForCausalLM` and its router load-balancing loss (coefficient {s['aux_coef']}), then converted by the pinned
llama.cpp's `convert_hf_to_gguf.py` and quantized by its `llama-quantize`. It writes Python-documentation-like text
and code; it knows little and reasons not at all: it is here so that bmoe streams real, trained routing, and a
first run shows words a model wrote.

## How it was made
- Corpus: the reST sources of Python's documentation and the standard library's modules, from Debian's {pkgs}
  (`apt-get download`; deb sha256 in recipe.json; both built from Debian's source package python3.11, whose
  copyright file is LICENSE.corpus). Corpus sha256 (package versions + every file's path and sha256):
  `{c['sha256']}`.
- Split by file name (sha256 of the path): {c['train_files']} training files, {len(c['heldout_files'])} held out
  (listed in recipe.json). {c['train_tokens']} training tokens (documents and {c['train_docs'] - c['train_files']}
  chat-formatted samples made from the training files' reST sections), {c['heldout_tokens']} held-out tokens.
- Tokenizer: byte-level BPE trained with `tokenizers` on the training side only; Qwen2's pre-tokenizer; ChatML
  special tokens and chat template. The converter's one addition: it is told this pre-tokenizer is `qwen2`
  (harness/recipe/convert.py), and llama.cpp's tokens equal the HF tokenizer's on held-out text (tokcheck.json,
  tests/gates/test_trained_model.py).
- Training: {s['steps']} steps of {s['batch']} x {s['seq_len']} tokens ({s['steps'] * s['batch'] * s['seq_len']}
  tokens), AdamW (0.9, 0.95, weight decay 0.1), peak learning rate {s['lr']}, {s['warmup']} warm-up steps, cosine to
  10%. Loss by step: loss.csv (loss, its cross-entropy part, the router's aux loss, held-out cross-entropy every
  {s['eval_every']} steps); the log: train.log.
- Wall time on this machine (2 cores, shared with other work): training {r['wall_s']['train'] / 60:.0f} min, the
  whole recipe {r['wall_s']['total'] / 60:.0f} min (from its first log line to the last file, resumed invocations
  and any wait between them included).

## Held-out quality
Cross-entropy {h['cross_entropy_nats']} nats a token, perplexity **{h['perplexity']}**, over {h['tokens']} held-out
tokens (the trained float32 weights in torch, windows of {s['seq_len']} tokens; the GGUF files' own figures come from
bmoe's quality campaigns).

## Files
| file | sha256 |
|---|---|
{files}

Versions: torch {r['versions']['torch']}, transformers {r['versions']['transformers']}.

## Licence
The weights are derived from text under the PSF License Agreement for Python (LICENSE.corpus: Debian's copyright
files of both packages). bmoe's code is Apache-2.0.
"""
