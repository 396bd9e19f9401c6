"""Many generations on one loaded engine: the model, the expert cache and the KV cache stay across turns.

A `Conversation` owns the tokens whose keys and values are in the context (`past`). Each turn takes the whole
prompt as tokens (a chat's history rendered through the model's own template, `chat_prompt`), keeps the longest
common prefix with `past` in the KV cache, removes the rest and prefills only the new suffix, then decodes
token by token, yielding one `Delta` (the token's `TokenRow`, its `turn` set, and its text) per token. The
caller's `cancel` is checked between tokens (never inside llama.cpp's eval callback). The session protocol,
the terminal chat and the HTTP server all generate through this one loop, which drives the tokens through the
engine's one generation driver (harness.engine.run.token_loop.TokenLoop: prefill, decode, rows, summary).
"""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.engine.model.prompt import render
from harness.engine.run.engine import Engine
from harness.engine.run.session import Sampling
from harness.engine.run.sinks import TextSink
from harness.engine.run.token_loop import TokenLoop
from harness.engine.serve.tokenize import TOKENIZE_S, bound_of, tokenize
from harness.errors import UserError
from harness.formats.metrics_csv import Summary, TokenRow

ROLES = ("system", "user", "assistant")


@dataclass
class Delta:
    row: TokenRow
    text: str  # the token's text (UTF-8 decoded incrementally: a character split over tokens comes whole)


@dataclass
class TurnResult:
    turn: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    n_prompt: int = 0  # tokens in this turn's prompt
    n_reused: int = 0  # of which were already in the KV cache (not recomputed)
    n_past: int = 0  # tokens in the KV cache after the turn
    finish: str = "length"  # "stop" (end of generation token), "length" (n_predict), "cancelled"
    summary: Summary = field(default_factory=Summary)


def check_messages(messages: object) -> list[dict[str, str]]:
    """A chat history as [{"role", "content"}...]; UserError naming what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise UserError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise UserError(f"messages[{i}] must be {{\"role\": one of {', '.join(ROLES)}, \"content\": text}}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def chat_prompt(model: str, template: str, messages: list[dict[str, str]], *, no_think: bool = False) -> str:
    """The history rendered through the model's own chat template, the assistant's turn opened. Without
    `no_think` this is llama.cpp's built-in form of the template (as `--chatml`, many messages); with it, the
    Jinja template with reasoning off (Qwen3's enable_thinking=false; harmony is refused here)."""
    if not template:
        raise UserError(f"{model} has no chat template (tokenizer.chat_template); send a raw prompt instead")
    if no_think:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from harness.engine.model.prompt import is_harmony

        if is_harmony(template):
            raise UserError(f"{model}: --no-think with a harmony template is single-turn only; drop --no-think")
        if render(template, "x", enable_thinking=False) == render(template, "x"):
            raise UserError(f"{model}: its chat template has no way to switch reasoning off; drop --no-think")
        fmt = Jinja2ChatFormatter(template, eos_token="", bos_token="", add_generation_prompt=True)
        return fmt(messages=messages, enable_thinking=False).prompt
    from llama_cpp import llama_cpp as L

    msgs = (L.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        msgs[i].role, msgs[i].content = role, content
    tmpl = template.encode()
    n = 2 * sum(len(b) for b in keep) + 1024
    for _ in range(2):
        buf = ctypes.create_string_buffer(n)
        got = L.llama_chat_apply_template(tmpl, msgs, len(messages), True, buf, n)
        if got < 0:
            raise UserError(f"{model}: llama.cpp cannot apply this model's chat template")
        if got <= n:
            return buf.raw[:got].decode("utf-8", "replace")
        n = got + 1
    raise UserError(f"{model}: the chat template's output kept growing")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Conversation:
    """Turns on one engine. Not thread-safe: one caller at a time (the server queues requests)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.sess = engine.session
        self.past: list[int] = []
        self.turn = 0
        self.sinks = [s for s in engine.sinks if not isinstance(s, TextSink)]  # the caller shows the text
        self.last: TurnResult | None = None
        self.bound = bound_of(self.sess)  # how many bytes of prompt the context can hold, at most

    @property
    def n_ctx(self) -> int:
        return self.engine.cfg.ctx

    def prompt_tokens(self, *, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                      n_predict: int = 0, stop: Callable[[], bool] = lambda: False,
                      limit_s: float = TOKENIZE_S) -> list[int]:
        """Tokens of a chat history (through the template) or of a raw prompt (as given). A text that cannot fit in
        the context beside `n_predict` tokens is refused before it is tokenized; a long one is tokenized in a child
        process, stopped (Stopped) when `stop()` turns true and refused after `limit_s` (serve.tokenize)."""
        if messages is not None:
            cfg = self.engine.cfg
            text = chat_prompt(cfg.model, self.engine.layout.chat_template, check_messages(messages),
                               no_think=cfg.no_think)
        elif prompt is not None:
            text = prompt
        else:
            raise UserError("give messages or a prompt")
        self.check_size(text, n_predict)
        return tokenize(self.sess, text, stop, limit_s)

    def check_size(self, text: str, n_predict: int) -> None:
        """UserError when `text` has more bytes than the context can hold beside `n_predict` tokens (cheap: no
        tokenizing)."""
        self.bound.check(text.encode(), self.n_ctx, n_predict)

    def check_fits(self, tokens: list[int], n_predict: int) -> None:
        if not tokens:
            raise UserError("the prompt is empty")
        if len(tokens) + n_predict > self.n_ctx:
            raise UserError(f"prompt ({len(tokens)} tokens) + {n_predict} tokens to generate exceeds the context "
                            f"of {self.n_ctx} tokens; shorten the prompt, lower max_tokens or raise -c")

    def reusable(self, tokens: list[int], reuse: bool = True) -> int:
        """How many of the prompt's tokens are already in the KV cache (at least one is always decoded: the
        first token is sampled from its logits); 0 with --no-kv-reuse or `reuse` False (the server's request
        from another conversation than the cache's)."""
        if not (reuse and self.engine.cfg.kv_reuse):
            return 0
        return max(0, min(common_prefix(self.past, tokens), len(tokens) - 1))

    def _keep(self, n: int) -> None:
        """Keep the first n tokens' KV, drop the rest."""
        if n < len(self.past):
            n = self.sess.keep_prefix(n)
            del self.past[n:]

    def generate(self, tokens: list[int], sp: Sampling, cancel: Callable[[], bool] = lambda: False,
                 reuse: bool = True) -> Iterator[Delta]:
        """One turn; `self.last` holds its result once the generator is exhausted (or closed). With `reuse`
        False the KV cache is emptied first: nothing of what it held shapes this turn."""
        self.check_fits(tokens, sp.n_predict)
        sess = self.sess
        res = TurnResult(turn=self.turn, n_prompt=len(tokens))
        self.last = res
        self._keep(self.reusable(tokens, reuse))
        res.n_reused = len(self.past)
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        loop = TokenLoop(sess, sp, tokens, turn=self.turn, reused=res.n_reused, cancel=cancel)
        res.summary, res.tokens = loop.summary, loop.tokens
        self.past = loop.history  # what the KV cache holds, kept by the loop (emptied when a decode fails)
        rows = loop.rows()
        try:
            for row in rows:
                text = dec.decode(sess.piece(row.token_id))
                res.text += text
                for sink in self.sinks:
                    sink.row(row, text)
                try:
                    yield Delta(row, text)
                except GeneratorExit:
                    loop.stopped()  # the caller stopped reading (a client that went away)
                    raise
        finally:
            rows.close()
            res.finish = loop.finish
            res.text += dec.decode(b"", final=True)
            res.n_past = len(self.past)
            s = loop.finish_summary()
            for sink in self.sinks:
                sink.finish(s)
            self.turn += 1

    def run(self, tokens: list[int], sp: Sampling, cancel: Callable[[], bool] = lambda: False,
            on_delta: Callable[[Delta], None] = lambda d: None) -> TurnResult:
        for d in self.generate(tokens, sp, cancel):
            on_delta(d)
        assert self.last is not None
        return self.last


def sampling_of(cfg, **over: object) -> Sampling:
    """The engine flags' sampling, with a request's own values over it (None = keep the flag's)."""
    sp = Sampling.of(cfg, **over)
    if (cfg.ngram or cfg.mtp) and sp.temp > 0:
        flag = "--ngram" if cfg.ngram else "--mtp"
        raise UserError(f"this engine guesses ahead ({flag}), which is greedy only: send temp 0, or start it "
                        f"without {flag}")
    return sp
