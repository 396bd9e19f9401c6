"""Teacher-forced scoring of a fixed token sequence (`--fidelity-ref`, `--fidelity-against`): the text's tokens are
cut into chunks of the context size and each chunk is decoded from an empty KV cache in one batch, in llama.cpp's
`llama-perplexity --kl-divergence` layout (its first token replaced by BOS when the vocabulary adds one; logits for
positions ctx/2 .. ctx-2, each scored against the token after it), so the reference and every run against it
decode the same batches and a difference is the knob's, not batching's. The figures are harness.kld's; the files
harness.formats.fidelity's.

Every chunk is a prefill (the hook's phase 0): a knob that acts only while decoding one token at a time
(--route-ahead, --drop-cold-experts without --drop-in-prefill) changes nothing here, and config.rules refuses it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from harness import __version__, kld
from harness.engine.run.engine import Engine
from harness.engine.run.token_loop import collection_paused
from harness.errors import UserError
from harness.formats.fidelity import FidelityCsvWriter, RefFile, RefWriter, read_ref, scored_per_chunk

MIB = 1048576


@dataclass
class FidelityRun:
    """What a scoring run did: positions scored, chunks, the time in llama_decode and the whole scoring's wall
    time (decodes, log-probabilities, figures, writing), bytes the hook read; `stats` against a reference only."""

    positions: int
    n_chunk: int
    ctx: int
    decode_s: float
    total_s: float
    read_mib: float | None  # None: no hook (the plain mmap run)
    top_k: int
    covered: tuple[float, float]  # the reference's top K: mean and least probability mass held (kld.covered)
    stats: kld.FidelityStats | None = None

    def lines(self) -> list[str]:
        out = [f"bmoe: scored {self.positions} positions in {self.n_chunk} chunks of {self.ctx} tokens: "
               f"{self.total_s * 1e3:.0f} ms, {self.total_s / self.decode_s if self.decode_s else float('nan'):.3f}x "
               f"its {self.decode_s * 1e3:.0f} ms in llama_decode (scripts/fidelity_overhead.py compares with a plain "
               "prefill)"
               + (f", {self.read_mib:.2f} MiB of experts read" if self.read_mib is not None else ""),
               f"bmoe: the reference keeps each position's top {self.top_k} tokens: {100 * self.covered[0]:.4g}% of "
               f"the probability on average, {100 * self.covered[1]:.4g}% at least"
               + ("" if self.covered[1] >= 0.99 else " (KLD is then a lower bound: --fidelity-top-k 0 keeps all)")]
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


def _chunks(engine: Engine, tokens: np.ndarray, first: int, bos: int, timing: list[float]) \
        -> Iterator[tuple[int, np.ndarray]]:
    """(chunk index, logits of its positions first .. ctx-2) for each chunk; timing gets [decode_s, read_bytes]."""
    sess = engine.session
    hook = sess.hook
    n = scored_per_chunk(tokens.shape[1], first)
    for c, row in enumerate(tokens):
        toks = [int(t) for t in row]
        if bos >= 0:
            toks[0] = bos
        sess.clear_memory()
        if hook:
            hook.phase = 0
        t0 = time.perf_counter()
        sess.decode(toks, logits_from=first)
        timing[0] += time.perf_counter() - t0
        if hook:
            timing[1] += hook.take_counters().read_bytes
        yield c, sess.output_logits(n)


def score_ref(engine: Engine, out: str, top_k: int) -> FidelityRun:
    """`--fidelity-ref OUT`: score the -p text and write the reference (harness.formats.fidelity)."""
    sess, cfg = engine.session, engine.cfg
    tokens = chunked(sess.tokenize(sess.prompt_text()), cfg.ctx, f"--fidelity-ref {out}", cfg.fidelity_chunks)
    ctx, first, bos = cfg.ctx, cfg.ctx // 2, sess.bos_to_add()
    header = {"format_note": "natural log-probabilities; see harness/formats/fidelity.py", "engine": "bmoe",
              "engine_version": __version__, "arch": engine.layout.arch, "model_file": cfg.model,
              "n_vocab": sess.n_vocab, "ctx": ctx, "first": first, "n_chunk": int(tokens.shape[0]),
              "top_k": min(top_k, sess.n_vocab) if top_k else sess.n_vocab, "bos": bos,
              "config": {k: v for k, v in cfg.resolved().items() if k != "prompt"}}
    w = RefWriter(out, header, tokens)
    tails = []
    timing = [0.0, 0]
    t0 = time.perf_counter()
    try:
        with collection_paused():
            for c, logits in _chunks(engine, tokens, first, bos, timing):
                ref = kld.compact(logits, tokens[c, first + 1:], header["top_k"])
                w.rows(ref.ids, ref.lp, ref.tail_lp, ref.next_lp)
                tails.append(ref.tail_lp)
    except BaseException:
        w.abort()
        raise
    w.close()
    n = tokens.shape[0] * scored_per_chunk(ctx, first)
    return FidelityRun(n, int(tokens.shape[0]), ctx, timing[0], time.perf_counter() - t0,
                       timing[1] / MIB if sess.hook else None, header["top_k"], kld.covered(np.concatenate(tails)))


def check_ref(ref: RefFile, n_vocab: int) -> None:
    if int(ref.header["n_vocab"]) != n_vocab:
        raise UserError(f"--fidelity-against {ref.path}: the reference's vocabulary has {ref.header['n_vocab']} "
                        f"tokens, this model's {n_vocab}: score against a reference of a model with this vocabulary")


def score_against(engine: Engine, ref_path: str, csv_path: str | None) -> FidelityRun:
    """`--fidelity-against REF`: score REF's tokens with this run's knobs; the figures per position (to the CSV
    when given) and their summary."""
    sess, cfg = engine.session, engine.cfg
    ref = read_ref(ref_path)
    check_ref(ref, sess.n_vocab)
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
            for c, logits in _chunks(engine, ref.tokens, first, bos, timing):
                rows = ref.chunk_rows(c)
                cr = kld.Compact(ids=rows["ids"], lp=rows["lp"], tail_lp=rows["tail_lp"], next_lp=rows["next_lp"])
                nxt = ref.tokens[c, first + 1:]
                a = kld.against(cr, logits, nxt)
                parts.append(a)
                if w is not None:
                    p_ref = np.exp(cr.next_lp.astype(np.float64))
                    w.rows(c, first, nxt, cr.ids[:, 0], a.run_top, a.kld, p_ref, p_ref + a.dp)
    finally:
        if w is not None:
            w.close()
    total = time.perf_counter() - t0
    allp = kld.Against(*(np.concatenate([getattr(a, f) for a in parts])
                         for f in ("kld", "same_top", "dp", "run_top")))
    n_chunk = int(ref.tokens.shape[0])
    return FidelityRun(len(allp.kld), n_chunk, ctx, timing[0], total, timing[1] / MIB if sess.hook else None,
                       int(ref.header["top_k"]), kld.covered(ref.rows["tail_lp"]), kld.summarize(allp))
