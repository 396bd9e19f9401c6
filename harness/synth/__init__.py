"""Synthetic GGUF models for tests and benchmarks: seeded, deterministic, streamed to disk.

`make_model(out, ModelSpec(...))` writes one file or N shards; `plan_model(spec)` gives every tensor, the
sizes and, through `expert_locations`, where each routed expert lies, without writing anything."""

from harness.synth.plan import ExpertLocation, ModelPlan, expert_locations, plan_model, shard_paths
from harness.synth.spec import ARCHS, EXPERT_TYPES, ModelSpec, validate
from harness.synth.writer import make_model

__all__ = [
    "ARCHS",
    "EXPERT_TYPES",
    "ExpertLocation",
    "ModelPlan",
    "ModelSpec",
    "expert_locations",
    "make_model",
    "plan_model",
    "shard_paths",
    "validate",
]
