"""A quality campaign's questions: the prompts file every run of the folder is given (prompts.jsonl beside
the manifest), the plan's record of them and of the grading rule, made before the first run, and each run's
replies taken into its folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.errors import UserError
from harness.formats.campaign import QualitySpec
from harness.formats.folder import PROMPTS_FILE, REPLIES_FILE
from harness.formats.manifest import QualityRecord
from harness.formats.replies import PromptItem, prompts_text, read_replies
from harness.quality import gsm8k
from harness.quality.grade import GRADER, GRADER_VERSION


def prompt_items(q: QualitySpec) -> list[PromptItem]:
    return [PromptItem(id=x.id, prompt=gsm8k.render(q.template, x)) for x in gsm8k.select(q.n, q.ids)]


def quality_record(q: QualitySpec) -> QualityRecord:
    items = prompt_items(q)
    return QualityRecord(suite=q.suite, ids=[it.id for it in items], template=q.template,
                         dataset_sha256=gsm8k.dataset_sha256(),
                         prompts_sha256=hashlib.sha256(prompts_text(items).encode()).hexdigest(),
                         grader=GRADER, grader_version=GRADER_VERSION)


def write_prompts_file(folder: Path, q: QualitySpec) -> Path:
    p = Path(folder) / PROMPTS_FILE
    p.write_text(prompts_text(prompt_items(q)), encoding="utf-8")
    return p


def take_replies(fetched: Path | str | None, tmp: Path, n_questions: int, reason: str | None) -> str | None:
    """Move a quality run's replies into its folder; the run's failure reason if they are missing or short."""
    if fetched is None:
        return reason or "engine exited 0 but wrote no replies file"
    dest = tmp / REPLIES_FILE
    if Path(fetched) != dest:
        Path(fetched).replace(dest)
    if reason is not None:
        return reason
    try:
        n = len(read_replies(dest))
    except UserError as e:
        return f"engine exited 0 but its replies are unreadable: {e}"
    return None if n == n_questions else f"engine exited 0 but answered {n} of {n_questions} questions"
