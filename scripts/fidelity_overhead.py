"""What teacher-forced scoring (bmoe --fidelity-ref / --fidelity-against) costs over a plain prefill of the same
tokens, in one loaded engine: for each chunk of the text (the scoring's own chunks, harness.engine.run.fidelity),
in alternating order, (a) the plain prefill: the chunk decoded from an empty KV cache with the last token's logits
only, as a generation's prefill; (b) the scored decode: the same batch with logits for positions ctx/2..ctx-2, and
their copy; then, timed apart, (c) their compact form (harness.kld.compact, the reference's work) and (d) the figures
against it (harness.kld.against, a scored run's work). Prints the sums and the ratios (b+c)/a and (b+d)/a.

    PYTHONPATH=. python scripts/fidelity_overhead.py --text FILE --rounds 2 -- -m MODEL.gguf -c 128 [engine flags]
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

from harness import kld
from harness.engine.compose import open_engine
from harness.engine.config import parse_cli
from harness.engine.run.fidelity import chunked
from harness.engine.run.token_loop import collection_paused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=256)
    ap.add_argument("engine", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = [x for x in a.engine if x != "--"]
    cfg = parse_cli(flags + ["-p", Path(a.text).read_text()])
    eng = open_engine(cfg, io.StringIO())
    try:
        sess = eng.session
        tokens = chunked(sess.tokenize(sess.prompt_text()), cfg.ctx, a.text)
        first, bos = cfg.ctx // 2, sess.bos_to_add()
        n = cfg.ctx - 1 - first
        t = {"plain": 0.0, "scored": 0.0, "compact": 0.0, "against": 0.0}
        with collection_paused():
            for r in range(a.rounds):
                for c, row in enumerate(tokens):
                    toks = [int(x) for x in row]
                    if bos >= 0:
                        toks[0] = bos
                    for what in (("plain", "scored") if (r + c) % 2 == 0 else ("scored", "plain")):
                        sess.clear_memory()
                        t0 = time.perf_counter()
                        if what == "plain":
                            sess.decode(toks)
                            sess.logits(-1)
                        else:
                            sess.decode(toks, logits_from=first)
                            logits = sess.output_logits(n)
                        t[what] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    ref = kld.compact(logits, row[first + 1:], a.top_k)
                    t1 = time.perf_counter()
                    kld.against(ref, logits, row[first + 1:])
                    t["compact"] += t1 - t0
                    t["against"] += time.perf_counter() - t1
        n_tok = a.rounds * tokens.size
        print(f"{cfg.model}: {a.rounds} rounds x {tokens.shape[0]} chunks of {cfg.ctx} tokens ({n_tok} tokens), "
              f"vocab {sess.n_vocab}, top-k {a.top_k}")
        pl = t["plain"]
        print(f"  plain prefill {pl:.3f} s; the scored decodes (logits for positions ctx/2..ctx-2, copied) "
              f"{t['scored']:.3f} s ({t['scored'] / pl:.3f}x); the reference's compact form {t['compact']:.3f} s; "
              f"the figures against it {t['against']:.3f} s")
        print(f"  --fidelity-ref run {(t['scored'] + t['compact']) / pl:.3f}x plain prefill; --fidelity-against run "
              f"{(t['scored'] + t['against']) / pl:.3f}x")
    finally:
        eng.close()


if __name__ == "__main__":
    main()
