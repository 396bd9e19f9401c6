"""Fault injection for the correctness gates: a reader wrapper, installed by the CLI only when a test asks
(`BMOE_TEST_WRONG_EXPERT=layer,expert,wrong`, `BMOE_TEST_FAIL_AT_LAYER=N`, `BMOE_TEST_ZERO_DENSE=name`,
`BMOE_TEST_POISON_UNREAD=1`).
Production parts know nothing of it.

- wrong expert: every slice read of `expert` in `layer` gets `wrong`'s bytes instead (the negative control:
  the byte-identity gate must see one wrong expert);
- fail at layer: the first read of any expert of that layer raises inside the eval callback (the gate that
  an exception there becomes an error, never garbage output);
- zero dense: the anonymous copy of that dense tensor (`--dense-weights anon`) is zeros instead of its bytes
  (the control that the graph really reads the copies, not llama.cpp's file mapping);
- poison unread: before the first read into an expert tensor's reservation, all of it is filled with 0xFF
  bytes (NaN scales), so a matmul that computes from a slice never read gives NaN (the gate that a dropped
  expert, `--drop-cold-experts`, is never computed from its unread bytes).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from harness.engine.io.read_group import Gather
from harness.engine.io.reader import Read, SliceReader
from harness.engine.model.gguf_layout import ExpertTensor, ModelLayout
from harness.errors import UserError


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Faults:
    wrong_expert: tuple[int, int, int] | None = None  # (layer, expert, wrong expert)
    fail_at_layer: int | None = None
    zero_dense: str | None = None  # a dense tensor's name
    poison_unread: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Faults | None:
        """The faults a test asked for through the environment (its BMOE_TEST_* variables, read by the CLI); None
        when there are none."""
        wrong, fail = env.get("BMOE_TEST_WRONG_EXPERT"), env.get("BMOE_TEST_FAIL_AT_LAYER")
        zero = env.get("BMOE_TEST_ZERO_DENSE") or None
        poison = env.get("BMOE_TEST_POISON_UNREAD") == "1"
        if not wrong and not fail and not zero and not poison:
            return None
        try:
            we = tuple(int(x) for x in wrong.split(",")) if wrong else None
            fl = int(fail) if fail else None
        except ValueError:
            raise UserError("BMOE_TEST_WRONG_EXPERT takes layer,expert,wrong and BMOE_TEST_FAIL_AT_LAYER a layer "
                            "number") from None
        if we is not None and len(we) != 3:
            raise UserError(f"BMOE_TEST_WRONG_EXPERT takes layer,expert,wrong, got {wrong!r}")
        return cls(we, fl, zero, poison)  # type: ignore[arg-type]

    def wrap(self, reader: SliceReader, layout: ModelLayout) -> FaultyReader:
        return FaultyReader(reader, layout, self)


class FaultyReader:
    """A SliceReader that loads a wrong expert's bytes, or raises at one layer; otherwise the inner reader.
    The whole reader protocol (harness.engine.io.reader.ExpertReader): every read passes through `_submit` or
    `submit_many` here, the registered ones too (their reads computed here, so each still meets its faults)."""

    def __init__(self, inner: SliceReader, layout: ModelLayout, faults: Faults):
        self.inner = inner
        self.faults = faults
        # (file, slice position) -> (tensor, expert) for every routed-expert slice
        self._slices: dict[tuple[Path, int], tuple[ExpertTensor, int]] = {
            (et.path, et.abs_offset + e * et.nb2): (et, e) for et in layout.experts.values() for e in range(et.n_expert)
        }
        self._dense = {(t.path, t.abs_offset): name for name, t in layout.dense.items()}
        self._poisoned: set[str] = set()
        self._reg: list[tuple[Path, int, int, int]] = []  # registered tensors (register): path, pos0, nb2, addr0

    @property
    def odirect(self) -> bool:
        return self.inner.odirect

    @property
    def odirect_refused(self) -> str | None:
        return self.inner.odirect_refused

    @property
    def lanes_impl(self) -> str:
        return self.inner.lanes_impl

    def submit(self, path: Path, file_pos: int, length: int, addr: int, tag: int | None = None) -> Future:
        return self._submit(path, file_pos, length, addr, tag, self.inner.submit)

    def submit_many(self, path: Path, reads: list[Read]) -> Gather:
        """Each read gets its faults as in `submit`; the untouched ones go to the inner reader as one batch."""
        plain, parts = [], []
        for r in reads:  # in order: a poisoning read fills the reservation before any plain read is issued
            if self._faulted(path, r[0]):
                parts.append(self.submit(path, *r))
            else:
                plain.append(r)
        return Gather(parts + ([self.inner.submit_many(path, plain)] if plain else []))

    def submit_layer(self, tensors: list[tuple[Path, list[Read]]]) -> list[Gather]:
        """submit_many for each tensor (its faults as there)."""
        return [self.submit_many(path, reads) for path, reads in tensors]

    def register(self, path: Path, pos0: int, nb2: int, addr0: int) -> int:
        """Kept here, not with the inner reader: submit_registered computes each read and passes it through
        submit_many, so a registered read meets its faults as any other."""
        self._reg.append((path, pos0, nb2, addr0))
        return len(self._reg) - 1

    def submit_registered(self, ids: list[int], experts: list[int]) -> list[Gather]:
        """submit_layer of the registered tensors' slices of `experts` (untagged), as SliceReader.submit_registered
        computes them."""
        return self.submit_layer([(path, [(pos0 + e * nb2, nb2, addr0 + e * nb2, None) for e in experts])
                                  for path, pos0, nb2, addr0 in [self._reg[t] for t in ids]])

    def _faulted(self, path: Path, file_pos: int) -> bool:
        s = self._slices.get((path, file_pos))
        if s is None:
            return True  # not an expert slice: submit decides
        f, (et, e) = self.faults, s
        return ((f.poison_unread and et.name not in self._poisoned) or et.layer == f.fail_at_layer
                or (f.wrong_expert is not None and (f.wrong_expert[0], f.wrong_expert[1]) == (et.layer, e)))

    def submit_speculative(self, path: Path, file_pos: int, length: int, addr: int,
                           tag: int | None = None) -> Future:
        """A prefetch read gets the same faults as a demand one (the gates must see a wrong expert either way)."""
        return self._submit(path, file_pos, length, addr, tag, self.inner.submit_speculative)

    def promote(self, fut: Future) -> None:
        self.inner.promote(fut)

    def withdraw(self, futs: list[Future]) -> bool:
        return self.inner.withdraw(futs)

    def _submit(self, path: Path, file_pos: int, length: int, addr: int, tag: int | None,
                read: Callable[..., Future]) -> Future:
        if (path, file_pos) not in self._slices:  # a dense tensor's read (--dense-weights anon)
            if self._dense.get((path, file_pos)) != self.faults.zero_dense:
                return read(path, file_pos, length, addr, tag)
            ctypes.memset(addr, 0, length)
            zeroed: Future = Future()
            zeroed.set_result((length, 0))
            return zeroed
        et, e = self._slices[(path, file_pos)]
        if self.faults.poison_unread and et.name not in self._poisoned:
            self._poisoned.add(et.name)
            ctypes.memset(addr - (file_pos - et.abs_offset), 0xFF, et.nbytes)
        if et.layer == self.faults.fail_at_layer:
            raise InjectedFault(f"test fault injected at layer {et.layer} (BMOE_TEST_FAIL_AT_LAYER)")
        we = self.faults.wrong_expert
        if we is None or (we[0], we[1]) != (et.layer, e):
            return read(path, file_pos, length, addr, tag)
        if not self.inner.odirect:  # buffered reads: on the lanes as any read (with --recycle-pages into pool pages)
            return read(path, et.abs_offset + we[2] * et.nb2, length, addr, tag)
        # O_DIRECT: here, buffered and synchronous (an O_DIRECT read of another slice would land at another page
        # offset)
        with open(path, "rb") as f:
            f.seek(et.abs_offset + we[2] * et.nb2)
            data = f.read(length)
        ctypes.memmove(addr, data, length)
        done: Future = Future()
        done.set_result((length, 0))
        return done

    def release_mapped(self, path: Path, file_pos: int, length: int, mapped_addr: int) -> None:
        self.inner.release_mapped(path, file_pos, length, mapped_addr)

    def lane_tids(self) -> list[int]:
        return self.inner.lane_tids()

    def close(self) -> None:
        self.inner.close()
