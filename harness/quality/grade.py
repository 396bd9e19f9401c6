"""The GSM8K grading rule, fixed in code and versioned: a campaign records `GRADER` and `GRADER_VERSION`
in its manifest before the first reply, so any later change of the rule shows (a regrade under another
version is refused until the folder's plan is migrated or rerun).

Rule `gsm8k-final-number` v1, applied to the reply text:
1. Anything up to the last `</think>` is reasoning and is dropped.
2. The answer is the first number after the first `####` if there is one; otherwise the number inside the
   last `\\boxed{...}` if there is one; otherwise the last number in the reply. No number: no answer (wrong).
3. A number is an optional minus sign, digits with optional thousands commas (1,234 but not 12,34) and an
   optional decimal part; `$`, units and a trailing full stop around it are ignored.
4. Correct when that number equals the gold answer exactly as decimals (18, 18.0 and 18.00 equal 18).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

GRADER = "gsm8k-final-number"
GRADER_VERSION = 1

NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class Grade:
    extracted: str | None  # the number as it was found, commas removed; None when there was none
    how: str  # "####", "boxed", "last number" or "no number"
    correct: bool


def _num(s: str) -> str:
    return s.replace(",", "")


def extract(reply: str) -> tuple[str | None, str]:
    """(the answer number, commas removed, or None; which part of the rule found it)."""
    text = reply.rsplit("</think>", 1)[-1]
    if "####" in text:
        m = NUMBER.search(text.split("####", 1)[1])
        return (_num(m.group(0)), "####") if m else (None, "no number")
    boxed = BOXED.findall(text)
    if boxed:
        m = NUMBER.search(boxed[-1])
        if m:
            return _num(m.group(0)), "boxed"
    found = NUMBER.findall(text)
    if found:
        return _num(found[-1]), "last number"
    return None, "no number"


def grade(reply: str, gold: Decimal) -> Grade:
    got, how = extract(reply)
    return Grade(got, how, got is not None and Decimal(got) == gold)
