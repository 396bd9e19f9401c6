"""A campaign's `model: {recipe: ...}`: the synthetic model it names, and where the generated file lives.

Generated models are cached by content (the spec's hash) under $BMOE_MODEL_CACHE, else
~/.cache/bmoe/models, so a rerun or a second campaign with the same recipe reuses the file."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from harness.errors import UserError


def recipe_spec(recipe: dict[str, object]):
    """The ModelSpec of a recipe: a named shape (default tiny, as `make-model --shape`) with the given
    fields overridden. Raises UserError naming the problem."""
    import harness.synth as synth
    from harness.synth.shapes import shape_spec

    fields = {k: v for k, v in recipe.items() if k != "shape"}
    if isinstance(fields.get("arch_params"), dict):  # a mapping in YAML, name/value pairs in the spec
        fields["arch_params"] = tuple(sorted(fields["arch_params"].items()))
    known = {f.name for f in dataclasses.fields(synth.ModelSpec)}
    bad = sorted(set(fields) - known)
    if bad:
        raise UserError(f"{bad[0]}: not a model field; known: {', '.join(sorted(known))}")
    spec = shape_spec(str(recipe.get("shape", "tiny")), **fields)
    synth.validate(spec)
    return spec


def cache_root() -> Path:
    env = os.environ.get("BMOE_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bmoe" / "models"


def recipe_path(spec) -> Path:
    """Where the model of this spec is (or will be) generated: keyed by a hash of every field."""
    blob = json.dumps(dataclasses.asdict(spec), sort_keys=True, default=str).encode()
    key = hashlib.sha256(blob).hexdigest()[:16]
    return cache_root() / key / "model.gguf"


def ensure_model(spec, progress: bool = False) -> Path:
    """Generate the model if it is not there yet (written under a temporary name, then renamed)."""
    from harness.synth import make_model

    out = recipe_path(spec)
    done = out.with_suffix(".done")
    if done.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = make_model(out, spec, progress=progress)
    done.write_text(json.dumps({"files": [p.name for p in paths]}) + "\n")
    return out
