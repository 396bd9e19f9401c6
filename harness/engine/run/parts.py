"""The streaming parts of a run, as the composition root (harness.engine.compose) wired them."""

from __future__ import annotations

from dataclasses import dataclass

from harness.engine.cache.budget import CachePlan
from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.io.dense import DenseWeights
from harness.engine.io.reader import ExpertReader
from harness.engine.stream.hook import StreamHook


@dataclass
class Parts:
    """The streaming parts of a run (all None for the plain mmap run)."""

    plan: CachePlan | None = None
    cache: ExpertCache | None = None
    reader: ExpertReader | None = None
    hook: StreamHook | None = None
    dense: DenseWeights | None = None
    recycle: str = ""  # --recycle-pages as it took effect, and why (harness.engine.io.recycle.recycle_kind)

    def close(self) -> None:
        if self.hook:
            self.hook.close()
        if self.reader:
            self.reader.close()
        if self.dense:
            self.dense.close()
