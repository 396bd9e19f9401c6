"""The GSM8K test split shipped with bmoe (harness/data/gsm8k/, MIT, its LICENSE beside it): questions by id,
their gold answers, and the prompts a campaign sends.

A question's id is `gsm8k-test-NNNN`, its 0-based line in test.jsonl. The gold answer is the number after
the `####` of the worked solution, commas removed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from importlib import resources

from harness.errors import UserError

SUITE = "gsm8k"
SPLIT = "test"
PLACEHOLDER = "{question}"


@dataclass(frozen=True)
class Question:
    index: int
    question: str
    solution: str  # the worked answer as shipped

    @property
    def id(self) -> str:
        return question_id(self.index)

    @property
    def gold(self) -> Decimal:
        return gold_answer(self.solution)


def question_id(index: int) -> str:
    return f"{SUITE}-{SPLIT}-{index:04d}"


def gold_answer(solution: str) -> Decimal:
    """The number after the solution's `####`, commas removed."""
    if "####" not in solution:
        raise UserError(f"GSM8K solution without a '####' line: {solution[-80:]!r}")
    text = solution.rsplit("####", 1)[1].strip().replace(",", "")
    try:
        return Decimal(text)
    except InvalidOperation:
        raise UserError(f"GSM8K gold answer {text!r} is not a number") from None


def _data_bytes() -> bytes:
    return resources.files("harness").joinpath("data", SUITE, f"{SPLIT}.jsonl").read_bytes()


@cache
def questions() -> tuple[Question, ...]:
    out = []
    for i, line in enumerate(_data_bytes().decode("utf-8").split("\n")):
        if line.strip():
            obj = json.loads(line)
            out.append(Question(i, obj["question"], obj["answer"]))
    return tuple(out)


def dataset_sha256() -> str:
    return hashlib.sha256(_data_bytes()).hexdigest()


def select(n: int | None, ids: list[int] | None) -> list[Question]:
    """The first n questions, or the ones with these 0-based indices (in the order given)."""
    qs = questions()
    if ids is not None:
        bad = [i for i in ids if not 0 <= i < len(qs)]
        if bad:
            raise UserError(f"quality.ids: {bad[0]} is not a GSM8K test question (0..{len(qs) - 1})")
        return [qs[i] for i in ids]
    assert n is not None
    if n > len(qs):
        raise UserError(f"quality.n: {n} is more than the {len(qs)} GSM8K test questions")
    return list(qs[:n])


def render(template: str, q: Question) -> str:
    """The prompt for one question: the template with {question} replaced (no other braces are special)."""
    return template.replace(PLACEHOLDER, q.question)


def by_id(qid: str) -> Question:
    """The question named `gsm8k-test-NNNN`."""
    prefix = f"{SUITE}-{SPLIT}-"
    qs = questions()
    if qid.startswith(prefix) and qid[len(prefix):].isdigit() and int(qid[len(prefix):]) < len(qs):
        return qs[int(qid[len(prefix):])]
    raise UserError(f"{qid!r} is not a GSM8K test question id ({prefix}0000..{len(qs) - 1:04d})")
