"""The interface every eviction policy implements, as ExpertCache calls it."""

from __future__ import annotations

from collections.abc import Sequence

Key = tuple[int, int]  # (layer, expert)


class Policy:
    """Told about hits, inserts and evictions, and asked for a victim that is not protected (the
    current batch). `bind`, `on_batch` and `on_promote` are advisory and default to no-ops."""

    name = "base"
    offline = False

    def bind(self, budget_bytes: int, expert_bytes: Sequence[int]) -> None:  # noqa: B027 - advisory
        """Told once by ExpertCache: the byte budget and each layer's expert bytes."""

    def on_batch(self, layer: int, now: int) -> None:  # noqa: B027 - advisory hook, default no-op
        """The layer whose batch is about to be looked up."""

    def on_hit(self, key: Key, now: int) -> None:
        raise NotImplementedError

    def on_promote(self, key: Key, now: int) -> None:  # noqa: B027 - advisory hook, default no-op
        """A duplicate of an expert already looked up in this batch (a prefill batch is the union of
        every prompt token's experts): not a lookup, only a promotion."""

    def on_insert(self, key: Key, now: int) -> None:
        raise NotImplementedError

    def on_evict(self, key: Key) -> None:
        raise NotImplementedError

    def victim(self, protected: set[Key]) -> Key | None:
        raise NotImplementedError
