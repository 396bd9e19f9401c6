"""The OpenAI-compatible wire format `bmoe serve` speaks: request bodies (pydantic), response and SSE chunk
objects, error objects. Pure: no engine, no I/O.

Fields bmoe honours: model, messages (chat) or prompt (completions, a string), max_tokens (or
max_completion_tokens), temperature, top_p, seed, stream, top_k (an extension), and user: the conversation, the
only one whose KV prefix a request may reuse (harness.engine.serve.server). Text that is not Unicode (a lone
surrogate such as "\ud800", which JSON can spell) is refused with a 400 naming the field. Absent sampling fields take
the engine flags' values (`--temp 0`, greedy, by default; OpenAI's own default temperature is 1). `n` must be 1;
`stop`, penalties, logprobs and tools are not supported and are refused when set, so that a client never
silently gets something other than what it asked for. Every response carries `usage`, and a `bmoe` object with
the generation's telemetry (its summary, the prompt tokens reused from the KV cache, the token ids).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from harness.engine.serve.turns import TurnResult


def unicode_text(v: Any) -> Any:
    """`v` (a string, or the strings in a list or dict) unchanged if it is Unicode text; ValueError otherwise."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"not Unicode text: a lone surrogate {v[e.start]!r} at character {e.start}; send the "
                             "text as UTF-8") from None
    elif isinstance(v, list | tuple):
        for x in v:
            unicode_text(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            unicode_text(k)
            unicode_text(x)
    return v


Text = Annotated[str, AfterValidator(unicode_text)]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer"]
    content: Annotated[str | list[dict[str, Any]], AfterValidator(unicode_text)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text = ""
    user: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stream: bool = False
    n: int = 1
    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    tools: list[Any] | None = None

    def unsupported(self) -> str | None:
        if self.n != 1:
            return "n must be 1 (one model, one context)"
        if self.stop:
            return "stop sequences are not supported by bmoe serve"
        if self.logprobs:
            return "logprobs are not supported by bmoe serve"
        if self.tools:
            return "tools are not supported by bmoe serve"
        return None

    def sampling(self) -> dict[str, Any]:
        return {"n_predict": self.max_completion_tokens or self.max_tokens, "temp": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)

    def history(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_Common):
    prompt: Text


FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(res: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": res.n_prompt, "completion_tokens": len(res.tokens),
            "total_tokens": res.n_prompt + len(res.tokens), "prompt_tokens_details": {"cached_tokens": res.n_reused}}


def bmoe_summary(res: TurnResult) -> dict[str, Any]:
    return {"finish": res.finish, "n_reused": res.n_reused, "n_past": res.n_past, "turn": res.turn,
            "tok_s": round(res.summary.decode_tok_s, 3), "token_ids": res.tokens, "summary": res.summary.fields()}


class Ids:
    """The id, creation time and object names of one response."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, res: TurnResult) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": res.text},
                                      "finish_reason": FINISH[res.finish], "logprobs": None}
        else:
            choice = {"index": 0, "text": res.text, "finish_reason": FINISH[res.finish], "logprobs": None}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(res), "bmoe": bmoe_summary(res)}

    def chunk(self, text: str | None, finish: str | None = None, telemetry: dict[str, Any] | None = None,
              role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        d = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if telemetry is not None:
            d["bmoe"] = telemetry
        return d

    def usage_chunk(self, res: TurnResult) -> dict[str, Any]:
        """The last chunk (as OpenAI's stream_options.include_usage, sent always): no choices, the usage."""
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(res), "bmoe": bmoe_summary(res)}
