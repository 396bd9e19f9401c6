"""The one generation driver: a one-shot run and each --prompts-file prompt (harness.engine.run.engine), each turn
of the session protocol, the terminal chat and the server (harness.engine.serve.turns) generate through a
`TokenLoop`, which alone builds the per-token `TokenRow`s and the generation's `Summary`.

`rows()` prefills the prompt's tokens the KV cache does not hold yet, then from the first sampled token: stop on
an end-of-generation token or when `cancel` says so (checked between decodes), decode the token, hand out its
`TokenRow`, sample the next, up to `n_predict` tokens. With guess-ahead (`--ngram`, harness.engine.guess.ngram;
`--mtp`, harness.engine.guess.mtp) the sampled token and its guess are decoded in one batch with logits at every
position; the guesses that equal the greedy token at their position are kept, the next token is the greedy one
after them, and the rejected guesses' keys and values are removed from the KV cache. A batch that kept m guesses
yields m + 1 rows: its wall time, reads and counters are shared evenly among them (sums stay exact), and its
first row carries `draft_proposed` and `draft_accepted`. An MTP draft's time and reads are the group's too:
added to its wall time and read bytes. `finish_summary()` completes the summary with the run's totals.

Every generation runs under one garbage-collector policy (`collection_paused`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields

from harness.engine.guess.ngram import ngram_guess, split_int
from harness.engine.io import sysstats
from harness.engine.run.parts import Parts
from harness.engine.run.session import Sampler, Sampling, Session
from harness.engine.run.thread_clock import ThreadClock
from harness.engine.stream.hook import TokenCounters
from harness.formats.metrics_csv import UNMEASURED, Summary, TokenRow

MIB = 1048576


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while tokens are generated, whoever drives them: the hook allocates per node
    and per read, and a full collection (over every object the load created) cost ~10% of the CPU of a decode.
    What exists now is frozen (kept out of every collection) and collection is off; after, both are undone, so
    a long-lived server's older garbage is still collected between turns, and the generation's few cycles too."""
    on = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if on:
            gc.enable()


def _split_counters(c: TokenCounters, n: int) -> list[TokenCounters]:
    """A batch's counters over its n rows, every field summing exactly; an unmeasured one (-1) stays -1."""
    if n == 1:
        return [c]
    cols = {f.name: ([-1] * n if (v := getattr(c, f.name)) < 0 else split_int(v, n)) for f in fields(c)}
    return [TokenCounters(**{k: col[j] for k, col in cols.items()}) for j in range(n)]


def _mib(n: int) -> float:
    return round(n / MIB, 3)


class TokenLoop:
    """One generation on `sess`: `prompt` is the whole prompt's tokens, of which the KV cache holds the first
    `reused` already (a conversation turn; None for a run from an empty KV cache, whose summary also carries the
    load's reads and the prefill's /proc/self/io reads). `history` is what the KV cache holds (the prompt, then
    every decoded group; emptied, with the KV cache, when a decode fails). After `rows()` is exhausted or
    closed: `finish` is "stop" (end of generation), "length" (n_predict) or "cancelled"; `tokens` holds the tokens
    handed out; `finish_summary()` gives the complete summary."""

    def __init__(self, sess: Session, parts: Parts, sp: Sampling, prompt: list[int], *, turn: int = 0,
                 reused: int | None = None, cancel: Callable[[], bool] = lambda: False):
        self.sess, self.parts, self.sp = sess, parts, sp
        self.prompt, self.reused, self.turn = prompt, reused, turn
        self.n_predict = sp.n_predict
        self.cancel = cancel
        self.history = list(prompt)
        cfg = sess.cfg
        self.guessing = cfg.ngram or cfg.mtp
        self.draft, self.ngram_size = cfg.draft, cfg.ngram_size
        self.finish = "length"
        self.clock: ThreadClock | None = None
        self.tokens: list[int] = []
        self.summary = s = Summary()
        s.load_s = sess.load_s
        if reused is None:
            rb = sess.load.read_bytes
            s.extra["load_read_mib"] = _mib(rb) if rb >= 0 else UNMEASURED
            s.extra["load_populate"] = int(sess.load.mode.populate)
        else:
            s.extra["n_reused"] = reused

    def stopped(self) -> None:
        """The consumer stopped reading the rows (a client that went away): the generation was cancelled."""
        self.finish = "cancelled"

    # -- the generation ----------------------------------------------------------------------------------
    def rows(self) -> Iterator[TokenRow]:
        smpl = self.sess.sampler(self.sp)
        try:
            with collection_paused():
                t0 = time.perf_counter()
                self._prefill()
                yield from self._decode_rows(smpl, t0)
        finally:
            smpl.close()

    def _forget_all(self) -> None:
        """After a failed decode the KV cache's content is unknown: the next generation starts from nothing."""
        self.sess.clear_memory()
        self.history.clear()

    def _prefill(self) -> None:
        sess, s, hook = self.sess, self.summary, self.sess.hook
        suffix = self.prompt[self.reused or 0:]
        t0 = time.perf_counter()
        if hook:
            hook.phase = 0
        io_p = sysstats.proc_io_read_bytes() if self.reused is None else UNMEASURED
        try:
            sess.decode(suffix)
        except BaseException:
            self._forget_all()
            raise
        s.prefill_s = time.perf_counter() - t0
        if self.reused is None:
            io_q = sysstats.proc_io_read_bytes()
            s.extra["prefill_io_read_mib"] = _mib(io_q - io_p) if io_p >= 0 and io_q >= 0 else UNMEASURED
        s.n_prompt = len(suffix)
        if hook:
            s.extra["prefill_read_mib"] = _mib(hook.take_counters().read_bytes)
            hook.phase = 1
            if self.parts.reader is not None:  # the decode's CPU on the lanes, the releaser, this thread
                self.clock = ThreadClock(hook, self.parts.reader)
        if self.guessing:
            s.draft_groups = s.draft_proposed = s.draft_accepted = 0
        if sess.mtp is not None:  # the MTP head's share: time drafting and bytes read meanwhile
            s.extra.update(mtp_draft_ms=0.0, mtp_read_mib=0.0)

    def _guess(self, tok: int, room: int) -> list[int]:
        if not self.guessing or room <= 0:
            return []
        sess = self.sess
        if sess.mtp is not None:
            return sess.mtp.draft(tok, len(self.history), min(self.draft, room), sess.is_eog)
        return ngram_guess(self.history + [tok], self.ngram_size, min(self.draft, room), sess.is_eog)

    def _verify(self, smpl: Sampler, guess: list[int]) -> tuple[int, int]:
        """After the batch [token, *guess]: (guesses kept, the next token), the rejected guesses' KV removed."""
        kept = 0
        nxt = -1
        for i, g in enumerate(guess):
            nxt = smpl.sample(i)
            if nxt != g:
                break
            kept += 1
        else:
            nxt = smpl.sample(len(guess))
        if kept < len(guess):
            self.sess.forget_from(len(self.history) + 1 + kept)
        return kept, nxt

    def _decode_rows(self, smpl: Sampler, t0: float) -> Iterator[TokenRow]:
        sess, s = self.sess, self.summary
        hook = sess.hook
        cache = hook.cache if hook else None
        psi_path = sess.psi_path
        majflt0, cpu0 = sysstats.rusage()
        io0 = sysstats.proc_io_read_bytes()
        psi0 = sysstats.psi_some_us(psi_path) if psi_path else -1
        tok = smpl.sample()
        s.ttft_s = time.perf_counter() - t0
        t_loop = time.perf_counter()
        step = 1
        while step <= self.n_predict:
            if sess.is_eog(tok):
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
                sess.decode([tok, *guess], all_logits=bool(guess))
            except BaseException:
                self._forget_all()
                raise
            wall = time.perf_counter() - t1 + mtp_s
            t_loop = time.perf_counter()  # from here to the next decode: verify, rows, consumers, sampling
            kept, nxt = self._verify(smpl, guess) if guess else (0, -1)
            group = [tok, *guess[:kept]]
            self.history += group
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
                row = self._row(step, wall / n, loop_ms if j == 0 else 0.0, t, shares[j])
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
            tok = nxt if guess else smpl.sample()

    def _row(self, step: int, wall_s: float, loop_ms: float, tok: int, c: TokenCounters | None) -> TokenRow:
        """A token's row from the session's parts; `c` is its share of the hook's counters (None without a cache)."""
        sess = self.sess
        hook = sess.hook
        cache = hook.cache if hook else None
        r = TokenRow(step=step, steps=self.n_predict, wall_ms=wall_s * 1e3, turn=self.turn, loop_overhead_ms=loop_ms,
                     token_id=tok)
        if hook and cache is not None and c is not None:
            r.stall_ms, r.mgmt_ms, r.mgmt_cpu_ms = c.stall_ns / 1e6, c.mgmt_ns / 1e6, c.mgmt_cpu_ns / 1e6
            r.mgmt_hidden_ms, r.mgmt_bg_cpu_ms = c.mgmt_hidden_ns / 1e6, c.mgmt_bg_cpu_ns / 1e6
            r.io_ms = c.io_ns / 1e6
            r.compute_ms = wall_s * 1e3 - r.stall_ms - r.mgmt_ms
            r.read_bytes = c.read_bytes
            r.cache_hit_pct = cache.stats.hit_pct if cache.enabled else UNMEASURED
            r.cache_budget_mib = cache.budget / MIB
            r.prefetch_bytes, r.prefetch_used_bytes = c.prefetch_bytes, c.prefetch_used_bytes
            r.prefetch_wasted_bytes = c.prefetch_wasted_bytes
        if sess.dense is not None:
            r.dense_resident_frac = sess.dense.resident_frac(step)
        if hook and hook.route_ahead is not None:
            agree = hook.route_ahead.take_agreement()
            r.route_agree = UNMEASURED if agree is None else round(agree, 6)
        ps, mi = sysstats.proc_status(), sysstats.meminfo()
        r.rss_mib, r.rss_anon_mib, r.rss_file_mib, r.swap_mib = ps["VmRSS"], ps["RssAnon"], ps["RssFile"], ps["VmSwap"]
        r.mem_available_mib, r.mem_free_mib, r.swap_free_mib = mi["MemAvailable"], mi["MemFree"], mi["SwapFree"]
        return r

    # -- the summary's totals ----------------------------------------------------------------------------
    def finish_summary(self) -> Summary:
        """The summary completed with the run's totals (the experts per token the graph used, the cache's and
        the parts' totals; for a conversation turn also its turn, the KV cache's length and how it finished)."""
        s, p = self.summary, self.parts
        hook = self.sess.hook
        if hook:
            s.extra["k_effective"] = hook.k_effective
        if p.hook and p.cache:
            st = p.cache.stats
            s.hit_pct = st.hit_pct if p.cache.enabled else None
            s.cache_resident_mib = p.cache.resident_bytes / MIB if p.cache.enabled else None
            s.evictions = st.evictions if p.cache.enabled else None
            s.extra["cache_budget_mib"] = _mib(p.cache.budget)
            s.extra["token_cycle_mib"] = _mib(p.plan.cycle_bytes) if p.plan else -1
            s.extra["odirect"] = int(p.reader.odirect) if p.reader else 0
        if p.hook and p.hook.prefetch:
            s.extra.update(p.hook.prefetch.summary())
        if p.dense:
            s.extra.update(p.dense.summary())
        if p.hook and p.hook.drop:
            ds, dd, ps, pd = p.hook.drop_totals
            s.extra.update({"drop_decode_slots": ds, "drop_decode_dropped": dd,
                            "drop_decode_frac": round(dd / ds, 6) if ds else -1, "drop_prefill_slots": ps,
                            "drop_prefill_dropped": pd})
        if p.hook and p.hook.route_ahead is not None:
            agree = p.hook.route_ahead.agreement
            s.extra["route_agree"] = -1 if agree is None else round(agree, 6)
            s.extra["route_ahead_early_reads"] = int(p.hook.early_reads)
        if self.clock is not None:
            s.extra.update(self.clock.summary(s.read_bytes))
        s.extra["peak_rss_mib"] = round(sysstats.proc_status()["VmHWM"], 1)
        if self.reused is not None:
            s.extra.update(turn=self.turn, n_past=len(self.history), finish=self.finish)
        return s
