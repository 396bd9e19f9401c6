"""The base of the typed JSON records (manifest, run outcome, device samples): pydantic models that refuse
unknown keys, and a dump that writes back exactly the keys that were given.

`dump()` leaves out a field nobody set (a pending run has no outcome yet; a model description has only the
keys its source knows), so a file read and written again keeps its keys. Set fields by assignment or in
the constructor, never by mutating a default in place (a default list appended to stays unset)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.errors import UserError


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


def problem(e: ValidationError) -> str:
    """The first validation error as `where: what` on one line (e.g. `runs.3.status: Input should be ...`)."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "top level"
    return f"{where}: {err['msg']}" + (f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else "")


def validate(cls: type[Record], obj: object, what: str) -> Record:
    """cls.model_validate(obj), with a schema violation as a one-line UserError naming `what`."""
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        raise UserError(f"{what}: {problem(e)}") from None
