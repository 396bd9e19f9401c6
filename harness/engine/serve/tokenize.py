"""A prompt from outside (the server, the session) to tokens with bounded work.

- Size before work: every token covers at most `longest` bytes of the text (the vocabulary's longest piece,
  special tokens included), so a text of more than (n_ctx - n_predict) * longest bytes needs more tokens than
  the context leaves for it: `Bound.check` refuses it before anything is tokenized. Where a special token
  swallows the whitespace beside it (LSTRIP/RSTRIP), only the text's other bytes are counted; a vocabulary that
  normalizes its text (WPM, UGM, ...) may turn 4 bytes into one, and gets 4x the room.
- Tokenizing: llama.cpp's SPM tokenizer is superlinear in the pieces it falls back to bytes for (its output
  grows by an exact reserve() per piece, a copy of the whole vector each time: on the test vocabulary 64 KB of
  newlines take 0.16 s, 1 MB ~40 s), and one llama_tokenize call cannot be stopped. So a prompt over
  INLINE_BYTES is tokenized in a forked child process (the model's vocabulary shared copy-on-write, no thread
  of the parent's running there), which is killed the moment its request is cancelled, the process stops, or
  `limit_s` passes: the parent's threads, /health's among them, never wait on it, and nothing outlives its
  request. A shorter prompt tokenizes inline (at most a few ms).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from harness.engine.run.session import EngineError, Session
from harness.errors import UserError

INLINE_BYTES = 16384  # a prompt up to this size tokenizes inline: ~10 ms at worst on an SPM vocabulary
TOKENIZE_S = 10.0  # a prompt that takes longer to tokenize is refused (1 MB of plain text takes ~0.1 s)
_WHITESPACE = b" \t\n\r\v\f"  # what llama.cpp's LSTRIP/RSTRIP swallow beside a special token (C isspace)
_EXACT = (1, 2, 5)  # SPM, BPE, RWKV: every byte of the text is in some token's piece
_PR_SET_PDEATHSIG = 1


class Stopped(Exception):
    """The tokenizing was stopped: its request was cancelled or the process is stopping."""


@dataclass(frozen=True)
class Bound:
    longest: int  # bytes of the vocabulary's longest piece
    strips: bool  # some special token swallows the whitespace beside it
    per_byte: int = 1  # 4 for a vocabulary that normalizes its text

    def tokens_at_least(self, raw: bytes) -> int:
        n = len(raw) - (len(raw) - len(raw.translate(None, _WHITESPACE)) if self.strips else 0)
        return -(-n // (self.longest * self.per_byte))

    def check(self, raw: bytes, n_ctx: int, n_predict: int) -> None:
        """UserError when `raw` cannot fit in the context beside `n_predict` tokens to generate."""
        room = n_ctx - n_predict
        need = self.tokens_at_least(raw)
        if need > room:
            raise UserError(f"the prompt ({len(raw)} bytes) exceeds the context of {n_ctx} tokens: it needs at "
                            f"least {need} tokens (this vocabulary's longest token is {self.longest} bytes) and "
                            f"{n_predict} tokens to generate leave {max(room, 0)}; shorten the prompt, lower "
                            "max_tokens or raise -c")


def bound_of(sess: Session) -> Bound:
    """The vocabulary's bound, read once from its pieces (~2 us a token)."""
    L, vocab = sess.L, sess.vocab
    buf = ctypes.create_string_buffer(1024)
    longest, strips = 1, False
    strip = L.LLAMA_TOKEN_ATTR_LSTRIP | L.LLAMA_TOKEN_ATTR_RSTRIP
    for tok in range(L.llama_vocab_n_tokens(vocab)):
        n = L.llama_token_to_piece(vocab, tok, buf, len(buf), 0, True)
        longest = max(longest, n if n >= 0 else -n)  # -n: the piece needs that many bytes
        strips = strips or bool(L.llama_vocab_get_attr(vocab, tok) & strip)
    return Bound(longest, strips, 1 if L.llama_vocab_type(vocab) in _EXACT else 4)


def tokenize(sess: Session, text: str, stop: Callable[[], bool] = lambda: False,
             limit_s: float = TOKENIZE_S) -> list[int]:
    """`text`'s tokens (as Session.tokenize); Stopped when `stop()` turns true, UserError after `limit_s`."""
    raw = text.encode()
    if len(raw) <= INLINE_BYTES:
        return sess.tokenize(text)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        raise EngineError(f"cannot fork to tokenize a {len(raw)}-byte prompt: {e.strerror}") from None
    if pid == 0:  # the child: tokenizes, writes, exits; never returns here
        _child(sess, text, w)
    os.close(w)
    try:
        data = _collect(r, stop, time.monotonic() + limit_s, len(raw), limit_s)
    finally:
        os.close(r)
        _reap(pid)
    n = struct.unpack_from("<q", data)[0] if len(data) >= 8 else 0
    if n < 0:
        raise EngineError(f"tokenizing a {len(raw)}-byte prompt failed: {data[8:].decode(errors='replace')}")
    if len(data) != 8 + 4 * n:
        raise EngineError(f"tokenizing a {len(raw)}-byte prompt failed: its child process ended early")
    toks = array("i")
    toks.frombytes(data[8:])
    return toks.tolist()


def _collect(r: int, stop: Callable[[], bool], deadline: float, size: int, limit_s: float) -> bytes:
    got = bytearray()
    while True:
        if stop():
            raise Stopped
        left = deadline - time.monotonic()
        if left <= 0:
            raise UserError(f"the prompt ({size} bytes) took longer than {limit_s:g} s to tokenize and was refused; "
                            "send a shorter prompt (llama.cpp tokenizes text its vocabulary spells byte by byte "
                            "slowly)")
        if select.select([r], [], [], min(0.05, left))[0]:
            b = os.read(r, 1 << 20)
            if not b:
                return bytes(got)
            got += b


def _reap(pid: int) -> None:
    """Kill the child (done or not) and reap it; a thread waits for a child still dying (tearing down its copy of
    the address space takes a while on a loaded machine), so that nothing here waits on it."""
    try:
        os.kill(pid, signal.SIGKILL)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            threading.Thread(target=os.waitpid, args=(pid, 0), name="bmoe-tokenize-reap", daemon=True).start()
    except (ProcessLookupError, ChildProcessError):
        pass


def _child(sess: Session, text: str, w: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # its parent gone (killed), it goes too
        os.closerange(3, w)  # no copy of the parent's sockets keeps a connection open
        os.closerange(w + 1, 1 << 16)
        try:
            toks = array("i", sess.tokenize(text))
            out = struct.pack("<q", len(toks)) + toks.tobytes()
        except Exception as e:  # noqa: BLE001 - said to the parent, which raises it
            out = struct.pack("<q", -1) + f"{type(e).__name__}: {e}".encode()
        view = memoryview(out)
        while view:
            view = view[os.write(w, view):]
        code = 0
    finally:
        os._exit(code)
