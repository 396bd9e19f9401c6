"""The committed trained model (harness/data/models/tiny/, made by scripts/train-model.sh tiny): what `bmoe chat` and
`bmoe serve` run when no -m is given, so a first run shows words a model wrote, streamed from flash."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from harness.errors import UserError

FILE = "bmoe-tiny-Q4_K_M.gguf"


def folder() -> Path:
    return Path(str(resources.files("harness"))) / "data" / "models" / "tiny"


def path() -> Path:
    p = folder() / FILE
    if not p.is_file():
        raise UserError(f"bmoe: the bundled model {p} is missing (a partial install?): pass -m MODEL.gguf, "
                        "or reinstall bmoe")
    return p


def has_model_flag(argv: list[str]) -> bool:
    """Whether argv names a model already: -m/--model/-hf/--hf as a word, `--model=X`/`--hf=X`, or `-mX` attached."""
    for a in argv:
        if a in ("-m", "--model", "-hf", "--hf") or a.startswith(("--model=", "--hf=", "-hf=")):
            return True
        if a.startswith("-m") and not a.startswith("--"):
            return True
    return False
