"""The real toolchain's tiny models (toolchain venv only: imports torch and transformers, never imported by the
product or its tests): for each MoE family that transformers has a class for and the pinned llama.cpp converter
converts, a seeded random-init checkpoint built with transformers' own config and class, converted by the pinned
`convert_hf_to_gguf.py` and quantized by the pinned `llama-quantize` (scripts/real-toolchain-models.sh;
tests/gates/test_real_toolchain.py gates them)."""
