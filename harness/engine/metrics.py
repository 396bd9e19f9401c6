"""The `route_trace v1` writer (the other formats the engine writes live in harness/formats/)."""

from __future__ import annotations


class RouteTraceWriter:
    """`route_trace v1`: header comments, then turn,phase,step,layer,slot,expert,weight,residency,expert_bytes.
    The routing weight is not read by the hook (it would cost one more isolated node per layer), so the
    weight column is written as -1 (unmeasured)."""

    def __init__(self, path: str, model: str, arch: str, n_layer: int, n_expert: int, k: int,
                 expert_bytes: list[int], dense_bytes: dict[int, int]):
        self.f = open(path, "w")
        self.f.write("# route_trace v1\n")
        self.f.write(f"# model={model} arch={arch} n_layer={n_layer} n_expert={n_expert} n_expert_used={k}\n")
        for il in range(n_layer):
            self.f.write(f"# layer={il} expert_bytes={expert_bytes[il]} dense_bytes={dense_bytes.get(il, 0)}\n")
        self.f.write("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
        self.expert_bytes = expert_bytes

    def events(self, turn: int, step: int, events) -> None:
        w = self.f.write
        for ev in events:
            eb = self.expert_bytes[ev.layer]
            for tok, row in enumerate(ev.ids.tolist()):
                st = step + tok if ev.phase == 0 else step
                for slot, e in enumerate(row):
                    w(f"{turn},{ev.phase},{st},{ev.layer},{slot},{e},-1,{ev.residency.get(e, 0)},{eb}\n")

    def close(self) -> None:
        self.f.close()
