"""What a model file is: the GGUF layout of every expert slice, the architecture registry, the pinned llama.cpp's
architecture names and `struct ggml_tensor` mirror, and the prompt text (chat templates).

May import: harness.errors, harness.formats. Nothing else of the engine.
"""
