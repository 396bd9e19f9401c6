"""`bmoe-prompts v1` and `bmoe-replies v1`: the questions a `--prompts-file` run answers, and its answers.

Both are JSON lines, UTF-8, the first line a header `{"format": ..., "version": 1}`.

    prompts   one `{"id": "...", "prompt": "..."}` per line: the text before any chat template
    replies   one `Reply` per answered prompt, in order, written as each one ends (line-buffered: a killed
              engine leaves whole lines): its turn (0-based, the metrics CSV's `turn`), the prompt's id,
              the prompt exactly as sent to the model (after the chat template), the reply text (the
              generated tokens' bytes, decoded as UTF-8 with replacement once at the end), the token counts,
              why it stopped (eog: the model ended it; limit: -n was reached) and its times in ms.

A version newer than this code is refused, naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Literal

from pydantic import Field

from harness.errors import UserError
from harness.formats.folder import PROMPTS_FILE as PROMPTS_FILE  # campaigns/runner.py imports it from here
from harness.formats.folder_guard import MAX_RAW, loads, read_capped
from harness.formats.record import Record, validate

PROMPTS_FORMAT = "bmoe-prompts"
REPLIES_FORMAT = "bmoe-replies"
VERSION = 1


class PromptItem(Record):
    id: str = Field(min_length=1)
    prompt: str


class Reply(Record):
    turn: int
    id: str
    prompt: str  # exactly as sent: after the chat template
    reply: str
    n_prompt: int  # prompt tokens
    n_tokens: int  # generated tokens (the CSV rows of this turn)
    stop: Literal["eog", "limit"]
    prefill_ms: float
    decode_ms: float
    time_ms: float  # prefill + decode + the loop between tokens: the turn's wall time


def _header(fmt: str) -> str:
    return json.dumps({"format": fmt, "version": VERSION}) + "\n"


def prompts_text(items: list[PromptItem]) -> str:
    """The whole prompts file's text (its sha256 goes into a plan before the file is written)."""
    return _header(PROMPTS_FORMAT) + "".join(json.dumps(it.dump(), ensure_ascii=False) + "\n" for it in items)


def write_prompts(path: Path | str, items: list[PromptItem]) -> None:
    Path(path).write_text(prompts_text(items), encoding="utf-8")


def _lines(path: Path | str, fmt: str) -> list[tuple[int, dict]]:
    """(line number, object) of every line after a valid header."""
    try:
        text = read_capped(path, MAX_RAW).decode("utf-8")
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text: not a {fmt} file") from None
    out = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            obj = loads(line, f"{path}:{n}")
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: each line must be a JSON object")
        out.append((n, obj))
    if not out or out[0][1].get("format") != fmt:
        raise UserError(f"{path}: no {fmt} header line ({_header(fmt).strip()}); not a {fmt} file")
    v = out[0][1].get("version")
    if not isinstance(v, int) or v > VERSION or v < 1:
        raise UserError(f"{path}: {fmt} version {v!r} is not one this bmoe reads ({VERSION}); upgrade bmoe")
    return out[1:]


def read_prompts(path: Path | str) -> list[PromptItem]:
    items = [validate(PromptItem, obj, f"{path}:{n}") for n, obj in _lines(path, PROMPTS_FORMAT)]
    if not items:
        raise UserError(f"{path}: no prompts after the header")
    seen: set[str] = set()
    for it in items:
        assert isinstance(it, PromptItem)
        if it.id in seen:
            raise UserError(f"{path}: prompt id {it.id!r} appears twice; ids must be unique")
        seen.add(it.id)
    return items  # type: ignore[return-value]


def read_replies(path: Path | str) -> list[Reply]:
    out = [validate(Reply, obj, f"{path}:{n}") for n, obj in _lines(path, REPLIES_FORMAT)]
    for i, r in enumerate(out):
        assert isinstance(r, Reply)
        if r.turn != i:
            raise UserError(f"{path}: reply {i + 1} has turn {r.turn}, expected {i}: the file is out of order")
    return out  # type: ignore[return-value]


class RepliesWriter:
    def __init__(self, path: Path | str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.f: IO[str] = open(path, "w", encoding="utf-8", buffering=1)
        self.f.write(_header(REPLIES_FORMAT))

    def reply(self, r: Reply) -> None:
        self.f.write(json.dumps(r.dump(), ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.f.close()
