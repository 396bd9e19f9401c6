"""Per-architecture synthetic layouts, one small module each (the tensors llama.cpp's loader creates for that
architecture, and the metadata it reads). `NAMES` is data only, so that the spec can name them without importing
the layouts; `harness.synth.archs.dispatch` maps a name to its module."""

NAMES: tuple[str, ...] = (
    "granitemoe",
    "llama",
    "deepseek2",
    "glm4moe",
    "ernie4_5-moe",
    "hunyuan-moe",
    "dots1",
    "bailingmoe2",
)
