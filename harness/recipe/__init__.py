"""The trained-model recipe: a Qwen3-MoE trained here on 2 CPU cores, from a corpus installed from Debian, through a
BPE tokenizer trained with `tokenizers`, converted by the pinned llama.cpp's `convert_hf_to_gguf.py` and quantized by
its `llama-quantize` (scripts/train-model.sh runs it all).

The torch side (`train`, `tok`, `export`) runs only in the toolchain venv (scripts/toolchain-requirements.txt); the
product never imports it. `sizes` and `corpus`'s split and hashing are pure and tested in the product's venv."""
