"""bmoe: stream routed MoE experts from flash on llama.cpp's public API, and the harness that measures it."""

__version__ = "0.1.0"
