"""The flag types of a campaign file (harness.formats.campaign): an engine flag's name, its value, a cell label."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, PlainValidator
from pydantic_core import PydanticCustomError

FlagValue = bool | int | float | str | None  # true = bare flag, false/null = absent


def _check(pattern: str, message: str):
    """A validator: the string must match `pattern`, else `message` (formatted with the value)."""
    rx = re.compile(pattern)

    def check(v: str) -> str:
        if not rx.fullmatch(v):
            raise PydanticCustomError("campaign", message.format(v=v))
        return v
    return AfterValidator(check)


def _scalar(v: object) -> object:
    if v is not None and not isinstance(v, bool | int | float | str):
        raise PydanticCustomError("flag_value_type", "must be a single value")
    return v



FlagName = Annotated[str, _check(r"-[A-Za-z]|--[A-Za-z0-9][A-Za-z0-9_-]*",
                                 "{v!r} is not an engine flag; write it as the engine does, e.g. -t or --cache-mb")]
Value = Annotated[FlagValue, PlainValidator(_scalar)]
Flags = dict[FlagName, Value]
Label = Annotated[str, _check(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", "label {v!r} must be a word (letters, digits, _ . + -)")]

# a campaign family's name (`family:`): it names reports/<family>.md, so a plain name
FamilyName = Annotated[str, _check(r"[a-z0-9][a-z0-9_-]*", "{v!r} must be lower-case letters, digits, '-' or '_'")]


def render_value(v: FlagValue) -> str:
    """A flag value as cell labels show it: on, off, or the value."""
    if v is True:
        return "on"
    return "off" if v is None or v is False else str(v)
