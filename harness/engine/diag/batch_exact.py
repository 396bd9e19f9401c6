"""Is a verify batch bit-exact against one-token decoding? A diagnostic for guess-ahead (--ngram, --mtp).

After the same prefix, the logits of positions p..p+n-1 are computed (a) one token at a time, as plain greedy
decoding does, and (b) in one llama_decode batch with logits at every position, as a verify batch does; the two
are compared bit for bit. With `nodes=True` an eval callback also copies out every graph node of both and names
the first node (graph order) whose row for a position differs: its op, type, shape and sources' types.

The engine's own Session makes the context (resident or streamed, the same context parameters as a run) and the
probe drives it through its public surface (decode, logits, forget): not through a TokenLoop, whose prefill batch
would change the one-token reference this compares against. The node dump needs the eval callback, so it is
resident only (the streaming hook owns the callback).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.engine.model.ggml import GGML_MAX_DIMS, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, tensor_at
from harness.engine.run.session import Session
from harness.engine.run.token_loop import collection_paused

_NP = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_I32: np.int32}


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    type: str
    ne: tuple[int, ...]
    srcs: tuple[str, ...]  # "name:type[ne]" of each source
    data: np.ndarray | None  # the values, shape ne reversed (numpy order), None for types not copied


@dataclass
class NodeDump:
    """The eval callback: asks for every node, copies each one out after it is computed."""

    nodes: list[Node] = field(default_factory=list)
    on: bool = False
    tracing: None = None  # the Session's hook interface

    def __post_init__(self) -> None:
        from llama_cpp import llama_cpp as L

        self._ggml = _ggml_lib()
        self.cfunc = L.ggml_backend_sched_eval_callback(self._cb)
        self.user_data = None

    def raise_if_failed(self) -> None:
        pass

    def close(self) -> None:  # the hook interface (Parts.close)
        pass

    def _cb(self, t, ask, _ud) -> bool:
        if ask:
            return self.on
        try:
            self.nodes.append(self._node(t))
        except Exception:  # noqa: BLE001 - never raise into C
            pass
        return True

    def _desc(self, addr: int) -> str:
        t = tensor_at(addr)
        return f"{t.name.decode()}:{self._ggml.ggml_type_name(t.type).decode()}{list(t.ne)}"

    def _node(self, addr: int) -> Node:
        t = tensor_at(addr)
        g = self._ggml
        ne = tuple(int(x) for x in t.ne)
        data = None
        if t.type in _NP and t.data:
            dt = np.dtype(_NP[t.type])
            nb = tuple(int(x) for x in t.nb)
            span = sum((ne[i] - 1) * nb[i] for i in range(GGML_MAX_DIMS)) + dt.itemsize
            buf = (ctypes.c_char * span).from_address(t.data)
            arr = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=dt), shape=ne[::-1], strides=nb[::-1])
            data = np.array(arr)
        srcs = tuple(self._desc(s) for s in t.src if s)
        return Node(t.name.decode(), g.ggml_op_desc(ctypes.c_void_p(addr)).decode(), g.ggml_type_name(t.type).decode(),
                    ne, srcs, data)


def _ggml_lib():
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_op_desc.restype = ctypes.c_char_p
    lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    return lib


def token_row(single: Node, batch: Node, j: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The batch node's row for its j-th token next to the one-token node, or None where the token axis cannot
    be told (the shapes differ in more than one axis, or not as 1 against n)."""
    if single.data is None or batch.data is None:
        return None
    diff = [i for i in range(GGML_MAX_DIMS) if single.ne[i] != batch.ne[i]]
    if not diff:
        return (single.data, batch.data) if n == 1 else None
    if len(diff) != 1 or single.ne[diff[0]] != 1 or batch.ne[diff[0]] != n:
        return None
    ax = GGML_MAX_DIMS - 1 - diff[0]  # numpy axis
    return single.data, np.take(batch.data, [j], axis=ax)


def first_difference(singles: list[list[Node]], batch: list[Node]) -> tuple[int, Node, int, float] | None:
    """(node index, batch node, token j, max |diff|) of the first node in graph order whose row for some token
    differs bit for bit from that token decoded alone; None when every comparable node is identical."""
    n = len(singles)
    for idx, bn in enumerate(batch):
        for j, nodes in enumerate(singles):
            if idx >= len(nodes) or nodes[idx].name != bn.name:
                raise ValueError(f"graphs differ at node {idx}: {bn.name} vs "
                                 f"{nodes[idx].name if idx < len(nodes) else 'end'}")
            pair = token_row(nodes[idx], bn, j, n)
            if pair is None:
                continue
            a, b = pair
            if a.tobytes() != b.tobytes():
                return idx, bn, j, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    return None


@dataclass(frozen=True)
class Window:
    pos: int  # first position of the batch
    n: int
    identical: bool  # every logit of every position bit-identical
    max_abs: float  # largest |logit difference|
    argmax_flips: int  # positions whose greedy token differs
    first_node: str = ""  # the first differing node, where the dump was on


class Probe:
    """Drives a Session by hand: greedy one-token decoding of a prompt's continuation (logits kept at every
    position), then each window of n positions again as one batch after the same prefix."""

    def __init__(self, sess: Session, dump: NodeDump | None = None):
        self.sess, self.dump = sess, dump

    def _one(self, tok: int, nodes: bool = False) -> tuple[np.ndarray, list[Node]]:
        d = self.dump
        if d is not None:
            d.on, d.nodes = nodes, []
        self.sess.decode([tok])
        got = d.nodes if d is not None else []
        if d is not None:
            d.on = False
        return self.sess.logits(-1), got

    def run(self, prompt: list[int], n_gen: int, n: int, nodes: bool = False) -> tuple[list[int], list[Window]]:
        with collection_paused():  # the same garbage-collector policy as every generation
            return self._run(prompt, n_gen, n, nodes)

    def _run(self, prompt: list[int], n_gen: int, n: int, nodes: bool) -> tuple[list[int], list[Window]]:
        sess = self.sess
        sess.clear_memory()
        sess.decode(prompt[:-1])
        seq = list(prompt)
        single: list[np.ndarray] = []  # single[i]: logits after decoding seq[len(prompt) - 1 + i]
        for _ in range(n_gen + n):
            lg, _ = self._one(seq[-1])
            single.append(lg)
            seq.append(int(np.argmax(lg)))
        base = len(prompt) - 1
        out: list[Window] = []
        for w in range(0, n_gen, n):
            pos = base + w
            toks = seq[pos:pos + n]
            first = ""
            singles: list[list[Node]] = []
            ref = single[w:w + n]
            if nodes and self.dump is not None:  # again with the dump on (it splits the graph at every node)
                sess.forget_from(pos)
                ref = []
                for t in toks:
                    lg, got = self._one(t, nodes=True)
                    ref.append(lg)
                    singles.append(got)
            sess.forget_from(pos)
            d = self.dump
            if d is not None:
                d.on, d.nodes = nodes, []
            sess.decode(toks, all_logits=True)
            if d is not None:
                d.on = False
            rows = [self.sess.logits(j) for j in range(n)]
            if nodes and d is not None:
                hit = first_difference(singles, d.nodes)
                if hit is not None:
                    idx, bn, j, mx = hit
                    first = (f"node {idx} {bn.name} op={bn.op} type={bn.type} ne={list(bn.ne)} "
                             f"srcs={list(bn.srcs)} token {j} max|d|={mx:.3g}")
                else:
                    first = "none"
            same = all(a.tobytes() == b.tobytes() for a, b in zip(ref, rows, strict=True))
            mx = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, rows, strict=True))
            flips = sum(int(np.argmax(a)) != int(np.argmax(b)) for a, b in zip(ref, rows, strict=True))
            out.append(Window(pos, n, same, mx, flips, first))
            # restore the one-token KV for the next window's prefix
            sess.forget_from(pos)
            for t in toks:
                self._one(t)
        return seq[len(prompt):], out
