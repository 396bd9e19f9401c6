"""The decode loop, shared by a one-shot run (`Session.run`) and a conversation turn (`turns.Conversation`).

From the first sampled token: stop on an end-of-generation token or when `cancel` says so (checked between
decodes), decode the token, hand out its `TokenRow`, sample the next, up to `n_predict` tokens. With
guess-ahead (`--ngram`, harness.engine.guess.ngram; `--mtp`, harness.engine.guess.mtp) the sampled token and its
guess are decoded in one batch with logits at every position; the guesses that equal the greedy token at their position
are kept, the next token is the greedy one after them, and the rejected guesses' keys and values are removed
from the KV cache. A batch that kept m guesses yields m + 1 rows: its wall time, reads and counters are shared
evenly among them (sums stay exact), and its first row carries `draft_proposed` and `draft_accepted`. An MTP
draft's time and reads are the group's too: added to its wall time and read bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any, Protocol

from harness.engine.config import EngineConfig
from harness.engine.guess.ngram import ngram_guess, split_int
from harness.engine.io import sysstats
from harness.engine.stream.hook import StreamHook, TokenCounters
from harness.formats.metrics_csv import UNMEASURED, Summary, TokenRow

MIB = 1048576


class Decoder(Protocol):
    """What the loop needs of the session (harness.engine.run.session.Session)."""

    L: Any
    cfg: EngineConfig
    ctx: Any
    vocab: Any
    hook: StreamHook | None
    mtp: Any  # harness.engine.guess.mtp.MtpDrafter with --mtp, else None

    def _decode(self, toks: list[int], all_logits: bool = False) -> None: ...

    def forget_from(self, pos: int) -> None: ...

    def _row(self, step: int, wall_s: float, loop_ms: float, tok: int, turn: int = 0,
             counters: TokenCounters | None = None) -> TokenRow: ...


def _split_counters(c: TokenCounters, n: int) -> list[TokenCounters]:
    """A batch's counters over its n rows, every field summing exactly; an unmeasured one (-1) stays -1."""
    if n == 1:
        return [c]
    cols = {f.name: ([-1] * n if (v := getattr(c, f.name)) < 0 else split_int(v, n)) for f in fields(c)}
    return [TokenCounters(**{k: col[j] for k, col in cols.items()}) for j in range(n)]


class TokenLoop:
    """One generation's decode loop. `history` is what the KV cache holds before it (the prompt's tokens);
    `on_decoded` gets every batch's tokens once llama_decode returned (and the rejected guesses are gone),
    `on_error` runs when a decode raises. After `rows()` is exhausted: `finish` is "stop" (end of generation),
    "length" (n_predict) or "cancelled"; `tokens` holds the tokens handed out."""

    def __init__(self, sess: Decoder, smpl, summary: Summary, *, n_predict: int, turn: int, history: list[int],
                 psi_path: str | None = None, cancel: Callable[[], bool] = lambda: False,
                 on_decoded: Callable[[list[int]], None] = lambda toks: None,
                 on_error: Callable[[], None] = lambda: None, on_first: Callable[[], None] = lambda: None):
        self.sess, self.smpl, self.s = sess, smpl, summary
        self.n_predict, self.turn = n_predict, turn
        self.history = list(history)
        self.psi_path = psi_path
        self.cancel, self.on_decoded, self.on_error, self.on_first = cancel, on_decoded, on_error, on_first
        cfg = sess.cfg
        self.guessing = cfg.ngram or cfg.mtp
        self.draft, self.ngram_size = cfg.draft, cfg.ngram_size
        self.finish = "length"
        self.tokens: list[int] = []
        if self.guessing:
            summary.draft_groups = summary.draft_proposed = summary.draft_accepted = 0
        if sess.mtp is not None:  # the MTP head's share: time drafting and bytes read meanwhile
            summary.extra.update(mtp_draft_ms=0.0, mtp_read_mib=0.0)

    def _guess(self, tok: int, room: int) -> list[int]:
        if not self.guessing or room <= 0:
            return []
        L, vocab = self.sess.L, self.sess.vocab
        if self.sess.mtp is not None:
            return self.sess.mtp.draft(tok, len(self.history), min(self.draft, room),
                                       lambda t: L.llama_vocab_is_eog(vocab, t))
        return ngram_guess(self.history + [tok], self.ngram_size, min(self.draft, room),
                           lambda t: L.llama_vocab_is_eog(vocab, t))

    def _verify(self, guess: list[int]) -> tuple[int, int]:
        """After the batch [token, *guess]: (guesses kept, the next token), the rejected guesses' KV removed."""
        sess, L = self.sess, self.sess.L
        kept = 0
        nxt = -1
        for i, g in enumerate(guess):
            nxt = L.llama_sampler_sample(self.smpl, sess.ctx, i)
            if nxt != g:
                break
            kept += 1
        else:
            nxt = L.llama_sampler_sample(self.smpl, sess.ctx, len(guess))
        if kept < len(guess):
            sess.forget_from(len(self.history) + 1 + kept)
        return kept, nxt

    def rows(self) -> Iterator[TokenRow]:
        sess, s, L = self.sess, self.s, self.sess.L
        hook = sess.hook
        cache = hook.cache if hook else None
        psi_path = self.psi_path
        majflt0, cpu0 = sysstats.rusage()
        io0 = sysstats.proc_io_read_bytes()
        psi0 = sysstats.psi_some_us(psi_path) if psi_path else -1
        tok = L.llama_sampler_sample(self.smpl, sess.ctx, -1)
        self.on_first()
        t_loop = time.perf_counter()
        step = 1
        while step <= self.n_predict:
            if L.llama_vocab_is_eog(sess.vocab, tok):
                self.finish = "stop"
                break
            if self.cancel():
                self.finish = "cancelled"
                break
            self.tokens.append(tok)
            mtp_s, mtp_b = (mtp.seconds, mtp.read_bytes) if (mtp := sess.mtp) is not None else (0.0, 0)
            guess = self._guess(tok, self.n_predict - step)
            if mtp is not None:  # the MTP head's draft is part of this group's work: its time and its reads
                mtp_s, mtp_b = mtp.seconds - mtp_s, mtp.read_bytes - mtp_b
                s.extra["mtp_draft_ms"] = round(float(s.extra["mtp_draft_ms"]) + mtp_s * 1e3, 3)  # type: ignore[arg-type]
                s.extra["mtp_read_mib"] = round(float(s.extra["mtp_read_mib"]) + mtp_b / MIB, 3)  # type: ignore[arg-type]
            loop_ms = (time.perf_counter() - t_loop - mtp_s) * 1e3
            t1 = time.perf_counter()
            try:
                sess._decode([tok, *guess], all_logits=bool(guess))
            except BaseException:
                self.on_error()
                raise
            wall = time.perf_counter() - t1 + mtp_s
            t_loop = time.perf_counter()  # from here to the next decode: verify, rows, consumers, sampling
            kept, nxt = self._verify(guess) if guess else (0, -1)
            group = [tok, *guess[:kept]]
            self.history += group
            self.on_decoded(group)
            n = len(group)
            s.decode_s += wall
            s.n_decode += n
            if guess:
                s.draft_groups = (s.draft_groups or 0) + 1
                s.draft_proposed = (s.draft_proposed or 0) + len(guess)
                s.draft_accepted = (s.draft_accepted or 0) + kept
            shares = _split_counters(hook.take_counters(), n) if hook and cache is not None else [None] * n
            majflt, cpu = sysstats.rusage()
            majflts, cpu_ms = split_int(majflt - majflt0, n), (cpu - cpu0) * 1e3 / n
            majflt0, cpu0 = majflt, cpu
            stall_ms = UNMEASURED
            if psi_path is not None:
                psi = sysstats.psi_some_us(psi_path)
                if psi >= 0 and psi0 >= 0:
                    stall_ms = (psi - psi0) / 1e3 / n
                psi0 = psi
            io_reads = None
            mtp_reads = split_int(mtp_b, n) if mtp is not None and cache is not None else None
            if cache is None:
                io = sysstats.proc_io_read_bytes()
                io_reads = split_int(io - io0, n) if io >= 0 and io0 >= 0 else [UNMEASURED] * n
                io0 = io
            for j, t in enumerate(group):
                if j:
                    self.tokens.append(t)
                row = sess._row(step, wall / n, loop_ms if j == 0 else 0.0, t, self.turn, counters=shares[j])
                row.steps = self.n_predict
                row.majflt = majflts[j]
                row.majflt_mib = round(majflts[j] * 4096 / MIB, 3)
                row.cpu_ms = cpu_ms
                if psi_path is not None:
                    row.mem_stall_ms = stall_ms
                if io_reads is not None:
                    row.read_bytes = io_reads[j]
                if mtp_reads is not None:
                    row.read_bytes += mtp_reads[j]
                if row.read_bytes != UNMEASURED:
                    s.read_bytes += row.read_bytes
                if self.guessing:
                    row.draft_proposed, row.draft_accepted = (len(guess), kept) if j == 0 else (0, 0)
                yield row
                step += 1
            tok = nxt if guess else L.llama_sampler_sample(self.smpl, sess.ctx, -1)
