"""Teacher-forced scoring of a fixed token sequence (`--fidelity-ref`, `--fidelity-against`): the text's tokens are
cut into chunks of the context size and each chunk is decoded from an empty KV cache, in llama.cpp's
`llama-perplexity --kl-divergence` layout (its first token replaced by BOS when the vocabulary adds one; logits for
positions ctx/2 .. ctx-2, each scored against the token after it), so the reference and every run against it
decode the same tokens and a difference is the knob's, not batching's. The figures are harness.kld's; the files
harness.formats.fidelity's.

Two ways to decode a chunk (the reference records which; a run against it must use the same):
- batch (the default): the whole chunk in one llama_decode, as llama-perplexity does. Every chunk is a prefill
  (the hook's phase 0): a knob that acts only while decoding one token at a time (--route-ahead,
  --drop-cold-experts without --drop-in-prefill) changes nothing there, and config.rules refuses it.
- `--fidelity-decode`: the chunk's first token alone (a one-token prompt, phase 0), then one llama_decode per
  token (phase 1), the hook's counters taken after each as the token loop does: every decode-time knob acts as
  in generation (a drop is decided per token, where in a batch an expert is dropped only when every token routing
  to it qualifies).

With --route-trace, each chunk is one turn of the trace: prefill rows at step 0 (+ the token's index in the
batch), decode rows at the hook's decode index + 1, which counts on across chunks (so --drop-replay finds each
recorded decision)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from harness import __version__, kld
from harness.engine.run.engine import Engine
from harness.engine.run.sinks import RouteTraceSink
from harness.engine.run.token_loop import collection_paused
from harness.errors import UserError
from harness.formats.fidelity import FidelityCsvWriter, RefFile, RefWriter, read_ref, scored_per_chunk

MIB = 1048576


@dataclass
class FidelityRun:
    """What a scoring run did: positions scored, chunks, the time in llama_decode and the whole scoring's wall
    time (decodes, log-probabilities, figures, writing), bytes the hook read; `stats` against a reference only.
    `next_lp` and `hits`: per position, the run's log-probability of the text's next token and whether its most
    probable token is that one (perplexity and next-token accuracy); `drops`: the hook's drop totals (decode
    slots, dropped, prefill slots, dropped), None without a drop rule."""

    positions: int
    n_chunk: int
    ctx: int
    decode_s: float
    total_s: float
    read_mib: float | None  # None: no hook (the plain mmap run)
    top_k: int
    covered: tuple[float, float]  # the reference's top K: mean and least probability mass held (kld.covered)
    next_lp: np.ndarray
    hits: np.ndarray
    decode: bool = False
    stats: kld.FidelityStats | None = None
    drops: list[int] | None = None

    def lines(self) -> list[str]:
        how = "one token at a time" if self.decode else "one batch each"
        out = [f"bmoe: scored {self.positions} positions in {self.n_chunk} chunks of {self.ctx} tokens ({how}): "
               f"{self.total_s * 1e3:.0f} ms, {self.total_s / self.decode_s if self.decode_s else float('nan'):.3f}x "
               f"its {self.decode_s * 1e3:.0f} ms in llama_decode (scripts/fidelity_overhead.py compares with a plain "
               "prefill)"
               + (f", {self.read_mib:.2f} MiB of experts read" if self.read_mib is not None else ""),
               f"bmoe: the reference keeps each position's top {self.top_k} tokens: {100 * self.covered[0]:.4g}% of "
               f"the probability on average, {100 * self.covered[1]:.4g}% at least"
               + ("" if self.covered[1] >= 0.99 else " (KLD is then a lower bound: --fidelity-top-k 0 keeps all)")]
        lp = np.asarray(self.next_lp, dtype=np.float64)
        if len(lp):
            out.append(f"bmoe: text: perplexity {float(np.exp(-lp.mean())):.6g} (mean log-probability of the next "
                       f"token {lp.mean():.6g} nats), next-token accuracy {100 * float(np.mean(self.hits)):.4g}% "
                       f"({int(np.count_nonzero(self.hits))}/{len(lp)})")
        if self.drops is not None:
            ds, dd, ps, pd = self.drops
            out.append(f"bmoe: dropped {dd} of {ds} decode slots ({100 * dd / ds if ds else 0:.4g}%), {pd} of {ps} "
                       "prefill slots")
        if self.stats is not None:
            out += [self.stats.line(), *kld.detail_lines(self.stats)]
        return out


def chunked(tokens: list[int], ctx: int, what: str, most: int = 0) -> np.ndarray:
    """The tokens as whole chunks of ctx (n_chunk, ctx), at most `most` of them (0: all); the rest of the text is not
    scored (as llama.cpp)."""
    n_chunk = len(tokens) // ctx
    if most:
        n_chunk = min(n_chunk, most)
    if n_chunk < 1:
        raise UserError(f"{what}: the text is {len(tokens)} tokens, less than one chunk of -c {ctx}; give a longer "
                        "text or a smaller -c")
    return np.asarray(tokens[:n_chunk * ctx], dtype=np.int32).reshape(n_chunk, ctx)


class _Routes:
    """--route-trace in a scoring run: after each decode, the hook's routing decisions to the trace (chunk = turn)."""

    def __init__(self, engine: Engine):
        hook = engine.parts.hook
        sink = next((x for x in engine.sinks if isinstance(x, RouteTraceSink)), None)
        self.hook, self.writer = (hook, sink.writer) if hook is not None and sink is not None else (None, None)

    def flush(self, chunk: int) -> None:
        if self.hook is None or self.writer is None:
            return
        events = self.hook.take_routes()
        self.writer.events(chunk, 0, [e for e in events if e.phase == 0])
        self.writer.events(chunk, self.hook.decode_index + 1, [e for e in events if e.phase != 0])


def _chunks(engine: Engine, tokens: np.ndarray, first: int, bos: int, timing: list[float], decode: bool) \
        -> Iterator[tuple[int, np.ndarray]]:
    """(chunk index, logits of its positions first .. ctx-2) for each chunk, decoded in one batch or (`decode`) one
    token at a time; timing gets [decode_s, read_bytes]."""
    sess = engine.session
    hook = engine.parts.hook
    routes = _Routes(engine)
    n = scored_per_chunk(tokens.shape[1], first)
    for c, row in enumerate(tokens):
        toks = [int(t) for t in row]
        if bos >= 0:
            toks[0] = bos
        sess.clear_memory()
        if not decode:
            if hook:
                hook.phase = 0
            t0 = time.perf_counter()
            sess.decode(toks, logits_from=first)
            timing[0] += time.perf_counter() - t0
            if hook:
                timing[1] += hook.take_counters().read_bytes
            routes.flush(c)
            yield c, sess.output_logits(n)
            continue
        out = np.empty((n, sess.n_vocab), dtype=np.float32)
        for p in range(len(toks) - 1):  # the last token's logits predict nothing scored
            if hook:
                hook.phase = 0 if p == 0 else 1
            t0 = time.perf_counter()
            sess.decode([toks[p]])
            timing[0] += time.perf_counter() - t0
            if hook:
                timing[1] += hook.take_counters().read_bytes
            routes.flush(c)
            if p >= first:
                out[p - first] = sess.logits(-1)
        yield c, out


def _drops(engine: Engine) -> list[int] | None:
    hook = engine.parts.hook
    return list(hook.drop_totals) if hook is not None and hook.drop is not None else None


def score_ref(engine: Engine, out: str, top_k: int) -> FidelityRun:
    """`--fidelity-ref OUT`: score the -p text and write the reference (harness.formats.fidelity)."""
    sess, cfg = engine.session, engine.cfg
    tokens = chunked(sess.tokenize(sess.prompt_text()), cfg.ctx, f"--fidelity-ref {out}", cfg.fidelity_chunks)
    ctx, first, bos = cfg.ctx, cfg.ctx // 2, sess.bos_to_add()
    header = {"format_note": "natural log-probabilities; see harness/formats/fidelity.py", "engine": "bmoe",
              "engine_version": __version__, "arch": engine.layout.arch, "model_file": cfg.model,
              "n_vocab": sess.n_vocab, "ctx": ctx, "first": first, "n_chunk": int(tokens.shape[0]),
              "top_k": min(top_k, sess.n_vocab) if top_k else sess.n_vocab, "bos": bos,
              "decode": bool(cfg.fidelity_decode),
              "config": {k: v for k, v in cfg.resolved().items() if k != "prompt"}}
    w = RefWriter(out, header, tokens)
    tails, lps, hits = [], [], []
    timing = [0.0, 0]
    t0 = time.perf_counter()
    try:
        with collection_paused():
            for c, logits in _chunks(engine, tokens, first, bos, timing, cfg.fidelity_decode):
                nxt = tokens[c, first + 1:]
                ref = kld.compact(logits, nxt, header["top_k"])
                w.rows(ref.ids, ref.lp, ref.tail_lp, ref.next_lp)
                tails.append(ref.tail_lp)
                lps.append(ref.next_lp)
                hits.append(ref.ids[:, 0] == nxt)
    except BaseException:
        w.abort()
        raise
    w.close()
    n = tokens.shape[0] * scored_per_chunk(ctx, first)
    return FidelityRun(n, int(tokens.shape[0]), ctx, timing[0], time.perf_counter() - t0,
                       timing[1] / MIB if engine.parts.hook else None, header["top_k"],
                       kld.covered(np.concatenate(tails)),
                       np.concatenate(lps), np.concatenate(hits), cfg.fidelity_decode, drops=_drops(engine))


def check_ref(ref: RefFile, n_vocab: int, decode: bool) -> None:
    if int(ref.header["n_vocab"]) != n_vocab:
        raise UserError(f"--fidelity-against {ref.path}: the reference's vocabulary has {ref.header['n_vocab']} "
                        f"tokens, this model's {n_vocab}: score against a reference of a model with this vocabulary")
    if bool(ref.header.get("decode", False)) != decode:
        fix = "add --fidelity-decode" if not decode else "drop --fidelity-decode"
        raise UserError(f"--fidelity-against {ref.path}: the reference was scored "
                        f"{'one token at a time' if not decode else 'one batch per chunk'}: {fix} (llama.cpp's "
                        "batched and one-token kernels round differently)")


def score_against(engine: Engine, ref_path: str, csv_path: str | None) -> FidelityRun:
    """`--fidelity-against REF`: score REF's tokens with this run's knobs; the figures per position (to the CSV
    when given) and their summary."""
    sess, cfg = engine.session, engine.cfg
    ref = read_ref(ref_path)
    check_ref(ref, sess.n_vocab, cfg.fidelity_decode)
    ctx, first, bos = ref.ctx, ref.first, int(ref.header["bos"])
    w = None
    if csv_path:
        w = FidelityCsvWriter(csv_path, {"reference": ref_path, "reference_model": ref.header.get("model_file", ""),
                                         "reference_top_k": ref.header["top_k"], "engine_version": __version__,
                                         "model_file": cfg.model, "kld_is": "KLD(ref||run) in nats over the "
                                         "reference's top_k tokens and the tail (harness/kld.py)",
                                         **{f"cfg.{k}": v for k, v in cfg.resolved().items() if k != "prompt"}})
    parts: list[kld.Against] = []
    timing = [0.0, 0]
    t0 = time.perf_counter()
    try:
        with collection_paused():
            for c, logits in _chunks(engine, ref.tokens, first, bos, timing, cfg.fidelity_decode):
                rows = ref.chunk_rows(c)
                cr = kld.Compact(ids=rows["ids"], lp=rows["lp"], tail_lp=rows["tail_lp"], next_lp=rows["next_lp"])
                nxt = ref.tokens[c, first + 1:]
                a = kld.against(cr, logits, nxt)
                parts.append(a)
                if w is not None:
                    p_ref = np.exp(cr.next_lp.astype(np.float64))
                    w.rows(c, first, nxt, cr.ids[:, 0], a.run_top, a.kld, p_ref, p_ref + a.dp, cr.next_lp,
                           a.next_lp)
    finally:
        if w is not None:
            w.close()
    total = time.perf_counter() - t0
    allp = kld.Against(*(np.concatenate([getattr(a, f) for a in parts])
                         for f in ("kld", "same_top", "dp", "run_top", "next_lp")))
    n_chunk = int(ref.tokens.shape[0])
    hits = allp.run_top == ref.tokens[:, first + 1:].reshape(-1)
    return FidelityRun(len(allp.kld), n_chunk, ctx, timing[0], total, timing[1] / MIB if engine.parts.hook else None,
                       int(ref.header["top_k"]), kld.covered(ref.rows["tail_lp"]), allp.next_lp, hits,
                       cfg.fidelity_decode, kld.summarize(allp), _drops(engine))
