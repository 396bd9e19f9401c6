#!/usr/bin/env python3
"""Is a verify batch bit-exact against one-token decoding on this build of llama.cpp? (issue 13 item 5)

  scripts/batch_exact.py MODEL [--prompt TEXT]... [--n 5] [--gen 20] [--stream [--cache-mb 1]] [--nodes] [-t 2] [-c 256]

Greedy-decodes each prompt's continuation one token at a time, then decodes each window of --n positions again
in one batch after the same prefix, and prints per window whether every logit is bit-identical (and the largest
difference, and how many greedy tokens flip). --nodes (resident only) also names the first graph node that
differs. Exit 0 when every window of every prompt is bit-identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from harness.engine.compose import open_engine
from harness.engine.config import parse_cli
from harness.engine.diag.batch_exact import NodeDump, Probe
from harness.engine.model.gguf_layout import load_layout
from harness.engine.run.parts import Parts
from harness.engine.run.session import LoadedModel, Session

PROMPTS = ["1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3 4 5 6 7 8 9 10 1 2 3",
           "The quick brown fox jumps over the lazy dog.", "a a a a a a a a"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt", action="append", help="repeatable; default: three built-in prompts")
    ap.add_argument("--n", type=int, default=5, help="positions per batch (a draft of n-1 plus its token)")
    ap.add_argument("--gen", type=int, default=20, help="positions compared per prompt")
    ap.add_argument("--stream", action="store_true", help="streamed (--moe-stream), not resident")
    ap.add_argument("--cache-mb", default="1", help="with --stream: the expert cache (default 1 MiB: it evicts)")
    ap.add_argument("--nodes", action="store_true", help="dump every graph node and name the first that differs")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-c", "--ctx", default="256")
    a = ap.parse_args(argv)
    if a.nodes and a.stream:
        ap.error("--nodes needs the eval callback, which streaming owns: drop --stream")
    flags = ["-m", a.model, "-c", a.ctx, "-t", a.threads, "-n", str(a.gen)]
    if a.stream:
        flags += ["--moe-stream", "--cache-mb", a.cache_mb, "--force-cache"]
    cfg = parse_cli(flags)
    dump = NodeDump() if a.nodes else None
    eng = None
    if a.stream:
        eng = open_engine(cfg, sys.stdout)
        sess = eng.session
    else:
        # the wiring order (harness.engine.compose): the model, the parts (here only the node dump), the session
        sess = Session(LoadedModel(cfg, load_layout(cfg.model)), Parts(hook=dump))  # type: ignore[arg-type]
    bad = 0
    try:
        probe = Probe(sess, dump)
        for text in a.prompt or PROMPTS:
            gen, wins = probe.run(sess.tokenize(text), a.gen, a.n, nodes=a.nodes)
            print(f"prompt {text[:40]!r}: generated {gen}")
            for w in wins:
                bad += not w.identical
                print(f"  pos {w.pos}..{w.pos + w.n - 1}: {'IDENTICAL' if w.identical else 'DIFFERENT'} "
                      f"max|d|={w.max_abs:.3g} argmax flips={w.argmax_flips}"
                      + (f"\n    first differing node: {w.first_node}" if w.first_node else ""))
    finally:
        if eng is not None:
            eng.close()
        else:
            sess.close()
    n_win = sum(1 for _ in range(0, a.gen, a.n)) * len(a.prompt or PROMPTS)
    print(f"{n_win - bad}/{n_win} windows bit-identical ({'streamed' if a.stream else 'resident'}, n={a.n})")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
