"""The engine's hook per decode token without llama.cpp: StreamHook's real callback fed fabricated ggml nodes
(the routing node of each layer, then its three expert matmuls) with the layout of the generated
qwen3-30b-a3b-shape model (its header only), its real ExpertCache and a reader whose reads do nothing (no I/O:
the 4 lanes return at once). Prints, per policy and decode token (medians): what the hook counts in mgmt_ns (wall
time, as the engine's CSV reports it), the CPU time of the callback thread over the whole token, and the part of
that CPU time spent in the cache (ExpertCache.lookup_batch + evict_over_budget). On a shared machine the wall
time also holds the waits for the GIL and for a core; the CPU times are the steadier measure.

    PYTHONPATH=<checkout> python hook_cost.py MODEL.gguf qwen|synth-top8 [POLICY ...]
"""

from __future__ import annotations

import ctypes
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

from harness.engine.cache import ExpertCache
from harness.engine.ggml import GGML_OP_MUL_MAT_ID, GGML_TYPE_I32, GgmlTensor
from harness.engine.gguf_layout import load_layout
from harness.engine.hook import StreamHook
from harness.replay.bookkeeping import MIB, workload


class NullReader:
    odirect, odirect_refused = True, None

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="null-io")

    def submit(self, path, file_pos: int, length: int, addr: int) -> Future:
        return self.pool.submit(lambda: (length, 0))

    def release_mapped(self, *a) -> None:
        pass

    def close(self) -> None:
        self.pool.shutdown()


def main(model: str, wl: str, policies: list[str]) -> None:
    layout = load_layout(model)
    w = workload(wl)
    k = len(w.batches[-1][1])
    keep = []

    def tensor(name: str, **kw) -> GgmlTensor:
        t = GgmlTensor()
        t.name = name.encode()
        for f, v in kw.items():
            setattr(t, f, v)
        keep.append(t)
        return t

    topk, mm = {}, {}
    for il, ets in layout.by_layer.items():
        ids = (ctypes.c_int32 * k)()
        keep.append(ids)
        t = tensor(f"{layout.row.topk_node}-{il}", type=GGML_TYPE_I32, op=0, data=ctypes.addressof(ids))
        t.ne[0], t.ne[1], t.nb[1] = k, 1, 4 * k
        topk[il] = (t, ids)
        nodes = []
        for et in ets:
            src = tensor(et.name, type=et.ggml_type, data=0)
            for i, d in enumerate(et.shape):
                src.ne[i] = d
            src.nb[2] = et.nb2
            node = tensor(f"mm-{et.name}", op=GGML_OP_MUL_MAT_ID)
            node.src[0] = ctypes.addressof(src)
            nodes.append(ctypes.addressof(node))
        mm[il] = nodes
    decode = [(layer, ex, tok) for layer, ex, tok in w.batches if tok >= 0]
    for pol in policies:
        cache = ExpertCache(2000 * MIB, layout.expert_bytes_per_layer(), pol, n_expert=layout.n_expert)
        hook = StreamHook(layout, cache, NullReader(), use_c_filter=False)
        cache_ns = [0]
        lb, ev = cache.lookup_batch, cache.evict_over_budget

        def timed(f, cache_ns=cache_ns):
            def g(*a, **kw):
                t0 = time.thread_time_ns()
                try:
                    return f(*a, **kw)
                finally:
                    cache_ns[0] += time.thread_time_ns() - t0
            return g

        cache.lookup_batch, cache.evict_over_budget = timed(lb), timed(ev)
        hook.phase = 1
        mgmt, cpu, cache_part = [], [], []
        tok_prev = None
        c0 = time.thread_time_ns()
        for layer, ex, tok in decode:
            if tok != tok_prev and tok_prev is not None:
                c = hook.take_counters()
                mgmt.append(c.mgmt_ns)
                cache_part.append(cache_ns[0])
                cache_ns[0] = 0
                c1 = time.thread_time_ns()
                cpu.append(c1 - c0)
                c0 = c1
            tok_prev = tok
            t, ids = topk[layer]
            for i, e in enumerate(ex):
                ids[i] = e
            addr = ctypes.addressof(t)
            hook._callback(addr, True, None)
            hook._callback(addr, False, None)
            for n in mm[layer]:
                hook._callback(n, True, None)
            if hook.error is not None:
                raise hook.error
        def med(v: list[int]) -> float:
            v = sorted(v[2:])  # the first tokens bind the tensors
            return v[len(v) // 2] / 1e6

        print(f"{wl},{pol},{med(mgmt):.3f},{med(cpu):.3f},{med(cache_part):.3f}", flush=True)
        hook.close()


if __name__ == "__main__":
    print("workload,policy,hook_mgmt_wall_ms,hook_cpu_ms,cache_cpu_ms")
    main(sys.argv[1], sys.argv[2], sys.argv[3:] or ["lru"])
