"""`bmoe --session`: a JSON-lines protocol on stdin/stdout over one loaded engine (the model, the expert cache and
the KV prefix stay across turns).

Requests, one JSON object per line (`cmd` as in the C++ engine's session protocol):
  {"cmd": "generate", "id": ANY, "messages": [{"role": "system"|"user"|"assistant", "content": TEXT}, ...],
   "n_predict": N, "temp": X, "top_k": N, "top_p": X, "seed": N}     (or "prompt": TEXT, fed as it is)
  {"cmd": "cancel"}      stops the generation in progress (its `done` says cancelled)
  {"cmd": "close"}       ends the session (so does the end of stdin)
Replies, one JSON object per line, named by `event` (the C++ engine prints the same facts as BMOE_READY,
BMOE_BEGIN, BMOE_PROGRESS, BMOE_DONE and BMOE_ERROR prefixed lines; here every line is plain JSON):
  ready  {load_s, arch, n_ctx, n_expert_used, mode, engine_version}           once, after the load
  begin  {id, turn, n_prompt, n_reused}   n_reused: prompt tokens already in the KV cache (not recomputed)
  token  {id, step, text, token_id, wall_ms, io_ms, compute_ms, mgmt_ms, stall_ms, read_mb, cache_hit_pct,
          rss_mib, mem_available_mib}                                          per token; -1 = unmeasured
  done   {id, turn, finish: stop|length|cancelled, cancelled, tokens, token_ids, text, n_prompt, n_reused,
          n_past, tok_s, summary: {the CSV's # summary fields}}   text: the deltas joined (plus U+FFFD when the
          reply ends inside a UTF-8 sequence)
  error  {id, fatal, msg}   a malformed line (not JSON, not an object, nested deeper than MAX_DEPTH) or a refused
          request (a prompt that cannot fit, refused before it is tokenized; one slower to tokenize than
          serve.tokenize.TOKENIZE_S) is not fatal: the session goes on
The messages go through the model's own chat template; each generate is one `turn` of the CSV. The prompt's
prefix already in the KV cache is kept (n_reused); llama.cpp's CPU kernels are not batch-size invariant, so a
reply after a reused prefix can differ at a near-tie from a fresh process's; --no-kv-reuse makes each turn
bit-identical to a fresh process given the same history.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any, TextIO, get_type_hints

from harness import __version__
from harness.engine.run.engine import Engine
from harness.engine.run.session import Sampling
from harness.engine.serve.tokenize import Stopped
from harness.engine.serve.turns import Conversation, Delta, TurnResult, sampling_of
from harness.errors import UserError
from harness.formats.metrics_csv import UNMEASURED, TokenRow

MIB = 1048576
_ROW_KEYS = ("wall_ms", "io_ms", "compute_ms", "mgmt_ms", "stall_ms", "cache_hit_pct", "rss_mib",
             "mem_available_mib")
SAMPLING: dict[str, type] = get_type_hints(Sampling)  # a request's sampling fields and their types


def row_telemetry(row: TokenRow) -> dict[str, Any]:
    """A token's live telemetry (rounded; -1 = unmeasured)."""
    d: dict[str, Any] = {k: round(getattr(row, k), 3) for k in _ROW_KEYS}
    d["read_mb"] = round(row.read_bytes / MIB, 4) if row.read_bytes >= 0 else UNMEASURED
    return d


def ready_fields(engine: Engine) -> dict[str, Any]:
    return {"load_s": round(engine.session.load_s, 3), "arch": engine.layout.arch, "n_ctx": engine.cfg.ctx,
            "n_expert_used": engine.k, "mode": "stream" if engine.cfg.moe_stream else "mmap",
            "engine_version": __version__}


def done_fields(res: TurnResult) -> dict[str, Any]:
    s = res.summary
    return {"turn": res.turn, "finish": res.finish, "cancelled": res.finish == "cancelled",
            "tokens": len(res.tokens), "token_ids": res.tokens, "text": res.text, "n_prompt": res.n_prompt,
            "n_reused": res.n_reused, "n_past": res.n_past, "tok_s": round(s.decode_tok_s, 3),
            "summary": s.fields()}


def sampling_request(req: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling values, type-checked (None where absent)."""
    out: dict[str, Any] = {}
    for k, t in SAMPLING.items():
        v = req.get(k)
        if v is None:
            out[k] = None
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or (t is int and not float(v).is_integer()):
            raise UserError(f"{k} must be a number{' (an integer)' if t is int else ''}, got {v!r}")
        out[k] = t(v)
    if out["n_predict"] is not None and out["n_predict"] < 1:
        raise UserError(f"n_predict must be >= 1, got {out['n_predict']}")
    if out["temp"] is not None and out["temp"] < 0:
        raise UserError(f"temp must be >= 0, got {out['temp']}")
    return out


MAX_DEPTH = 64  # a request line nested deeper is refused before it is parsed (a real request nests 4 levels)


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep `text`'s JSON arrays and objects nest (outside strings), counted up to `limit` + 1 at most."""
    depth = top = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > top:
                top = depth
                if top > limit:
                    break
        elif ch in "]}":
            depth -= 1
    return top


def parse_request(line: str) -> dict[str, Any]:
    """A request line as a JSON object; ValueError saying what is wrong (never RecursionError: depth is bounded)."""
    if json_depth(line) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    req = json.loads(line)
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object")
    return req


class LineSession:
    """Reads requests on a thread (so that `cancel` reaches a generation in progress), generates on the caller's
    thread, writes one JSON line per event."""

    def __init__(self, engine: Engine, inp: TextIO, out: TextIO, between_tokens: Callable[[], None] = lambda: None):
        self.engine = engine
        self.conv = Conversation(engine)
        self.inp, self.out = inp, out
        self.between_tokens = between_tokens
        self.lock = threading.Lock()
        self.cancel = threading.Event()
        self.todo: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **fields}, ensure_ascii=False)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _read(self) -> None:
        try:
            for line in self.inp:
                if line.strip() and self._line(line) == "close":
                    return
        except Exception as e:  # noqa: BLE001 - stdin itself failed (not text): the session ends, in one line
            self.emit("error", id=None, fatal=True, msg=f"cannot read the next request line: {type(e).__name__}: "
                      f"{e}; the session ends")
        finally:
            self.todo.put(None)  # after a close, never read: the session ends at its close or at the end of stdin

    def _line(self, line: str) -> str | None:
        """One request line: queued, acted on, or answered with an error; its cmd."""
        try:
            req = parse_request(line)
        except ValueError as e:
            self.emit("error", id=None, fatal=False, msg=f"malformed request line ({e}); send one JSON object "
                      "per line, e.g. {\"cmd\": \"generate\", \"messages\": [...]}")
            return None
        cmd = req.get("cmd")
        if cmd == "cancel":
            self.cancel.set()
        elif cmd in ("generate", "close"):
            self.todo.put(req)
        else:
            self.emit("error", id=req.get("id"), fatal=False,
                      msg=f"unknown cmd {str(cmd)[:80]!r}; use generate, cancel or close")
        return cmd if isinstance(cmd, str) else None

    def serve(self) -> int:
        self.emit("ready", **ready_fields(self.engine))
        threading.Thread(target=self._read, name="bmoe-session-stdin", daemon=True).start()
        while True:
            req = self.todo.get()
            if req is None or req.get("cmd") == "close":
                return 0
            self._generate(req)

    def _generate(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        self.cancel.clear()  # a cancel sent before this generate began does not carry over
        try:
            sp = sampling_of(self.engine.cfg, **sampling_request(req))
            if "messages" in req:
                tokens = self.conv.prompt_tokens(messages=req["messages"], n_predict=sp.n_predict,
                                                 stop=self.cancel.is_set)
            elif isinstance(req.get("prompt"), str):
                tokens = self.conv.prompt_tokens(prompt=req["prompt"], n_predict=sp.n_predict, stop=self.cancel.is_set)
            else:
                raise UserError("generate needs messages (a chat history) or prompt (text)")
            self.conv.check_fits(tokens, sp.n_predict)
        except UserError as e:
            self.emit("error", id=rid, fatal=False, msg=str(e))
            return
        except Stopped:
            self.emit("error", id=rid, fatal=False, msg="cancelled while its prompt was being tokenized")
            return

        def stop() -> bool:
            self.between_tokens()
            return self.cancel.is_set()

        self.emit("begin", id=rid, turn=self.conv.turn, n_prompt=len(tokens), n_reused=self.conv.reusable(tokens))
        for d in self.conv.generate(tokens, sp, stop):
            self._token(rid, d)
        assert self.conv.last is not None
        self.emit("done", id=rid, **done_fields(self.conv.last))

    def _token(self, rid: Any, d: Delta) -> None:
        self.emit("token", id=rid, step=d.row.step, text=d.text, token_id=d.row.token_id, **row_telemetry(d.row))
