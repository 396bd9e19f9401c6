"""`bmoe-grades v1`: a quality campaign folder's grades.json, every committed reply graded by the rule the
manifest names. Written by `bmoe-bench grade DIR` and `bmoe-bench report DIR` from the runs' replies.jsonl
files; `report --check` fails when it differs from a fresh grading.

    format, version, suite, grader, grader_version
    runs      one entry per finished run with replies, in plan order: run_id, cell, and one QuestionGrade per
              reply (question id, gold answer, the number extracted or null, which part of the rule found
              it, correct)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from harness.errors import UserError
from harness.formats.folder_guard import MAX_RAW, read_json
from harness.formats.record import Record, validate

FORMAT = "bmoe-grades"
VERSION = 1


class QuestionGrade(Record):
    id: str
    gold: str
    extracted: str | None
    how: str
    correct: bool


class RunGrades(Record):
    run_id: str
    cell: int
    grades: list[QuestionGrade]


class Grades(Record):
    format: Literal["bmoe-grades"] = FORMAT
    version: int = VERSION
    suite: str
    grader: str
    grader_version: int
    runs: list[RunGrades]


def grades_text(g: Grades) -> str:
    return json.dumps(g.model_dump(mode="json"), indent=1, ensure_ascii=False) + "\n"


def read_grades(path: Path | str) -> Grades:
    try:
        obj = read_json(Path(path), MAX_RAW)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{path}: not a {FORMAT} file")
    if not isinstance(obj.get("version"), int) or obj["version"] > VERSION:
        raise UserError(f"{path}: {FORMAT} version {obj.get('version')!r} is newer than this bmoe-bench reads "
                        f"({VERSION}); upgrade bmoe")
    g = validate(Grades, obj, str(path))
    assert isinstance(g, Grades)
    return g
