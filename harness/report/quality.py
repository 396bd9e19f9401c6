"""A quality campaign's grades and their findings section (pure apart from reading the runs' replies).

`grade_folder` regrades every committed reply with the rule the manifest names (refusing a folder whose
rule is not this code's); `quality_section` turns the grades into findings.md lines: per-cell accuracy with
its exact Clopper-Pearson interval, the exact McNemar test of each cell against the base on the same
questions, what the sample size can and cannot rule out, and every question whose grade differs between
cells with the replies of both."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.errors import UserError
from harness.formats.folder import REPLIES_FILE
from harness.formats.grades import Grades, QuestionGrade, RunGrades
from harness.formats.manifest import QualityRecord, run_dir
from harness.formats.replies import Reply, read_replies
from harness.quality import gsm8k
from harness.quality.grade import GRADER, GRADER_VERSION, grade
from harness.quality.stats import Accuracy, McNemar, accuracy, mcnemar_exact, min_discordant_for
from harness.report.collect import CampaignData


def _record(data: CampaignData) -> QualityRecord | None:
    return data.plan.quality


def read_run_replies(data: CampaignData) -> dict[str, list[Reply]]:
    """run_id -> its replies, for every ok run of a quality campaign (checked against the plan's ids)."""
    q = _record(data)
    assert q is not None
    out = {}
    for r in data.runs:
        if r.rec.status != "ok":
            continue
        path = run_dir(data.folder, r.run_id) / REPLIES_FILE
        if not path.is_file():
            raise UserError(f"{path} is missing: run {r.run_id} is recorded ok; restore it (git checkout) or "
                            f"rerun the campaign")
        replies = read_replies(path)
        ids = [x.id for x in replies]
        if ids != q.ids:
            raise UserError(f"{path}: its question ids are not the plan's ({len(ids)} replies, "
                            f"{len(q.ids)} questions planned); the file does not belong to this campaign")
        out[r.run_id] = replies
    return out


def grade_folder(data: CampaignData) -> Grades | None:
    """Every committed reply graded; None for a campaign without a quality block."""
    q = _record(data)
    if q is None:
        return None
    if (q.grader, q.grader_version) != (GRADER, GRADER_VERSION):
        raise UserError(f"{data.folder}: its replies were collected under grading rule {q.grader} "
                        f"v{q.grader_version}, this bmoe-bench grades with {GRADER} v{GRADER_VERSION}; grade it "
                        f"with the bmoe-bench of that rule, or rerun the campaign")
    runs = []
    for run_id, replies in read_run_replies(data).items():
        rec = next(r.rec for r in data.runs if r.run_id == run_id)
        gs = []
        for rep in replies:
            gold = gsm8k.by_id(rep.id).gold
            g = grade(rep.reply, gold)
            gs.append(QuestionGrade(id=rep.id, gold=str(gold), extracted=g.extracted, how=g.how, correct=g.correct))
        runs.append(RunGrades(run_id=run_id, cell=rec.cell, grades=gs))
    return Grades(suite=q.suite, grader=GRADER, grader_version=GRADER_VERSION, runs=runs)


# ---- statistics per cell ------------------------------------------------------------------------------------

@dataclass
class CellQuality:
    index: int
    label: str
    run_id: str  # the run whose replies are compared (the first ok round)
    grades: list[QuestionGrade]
    replies: list[Reply]
    acc: Accuracy
    vs_base: McNemar | None  # None for the base
    repeats_agree: bool | None  # other ok rounds gave the same replies (None: only one)


def cell_quality(data: CampaignData, g: Grades) -> list[CellQuality]:
    replies = read_run_replies(data)
    by_run = {rg.run_id: rg for rg in g.runs}
    rounds = {r.run_id: r.rec.round for r in data.runs}
    out: list[CellQuality] = []
    for c in data.cells:
        runs = sorted((rid for rid, rg in by_run.items() if rg.cell == c.index), key=lambda rid: rounds[rid])
        if not runs:
            continue
        first = runs[0]
        texts = [[x.reply for x in replies[rid]] for rid in runs]
        out.append(CellQuality(c.index, c.label, first, by_run[first].grades, replies[first],
                               accuracy([x.correct for x in by_run[first].grades]), None,
                               all(t == texts[0] for t in texts[1:]) if len(runs) > 1 else None))
    base = next((x for x in out if not data.cells[x.index].varied), None)
    if base is not None:
        for x in out:
            if x is not base:
                x.vs_base = mcnemar_exact([y.correct for y in base.grades], [y.correct for y in x.grades])
    return out


# ---- findings.md lines ---------------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _shown(text: str) -> str:
    """A reply as findings.md shows it: control characters (but newline and tab) escaped as \\uXXXX."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]", lambda m: f"\\u{ord(m.group(0)):04x}", text)


def _fenced(text: str) -> list[str]:
    fence = "~" * max(3, 1 + max((len(m) for m in re.findall(r"~+", text)), default=0))
    return [fence + "text", _shown(text), fence]


def quality_section(data: CampaignData, g: Grades) -> list[str]:
    q = _record(data)
    assert q is not None
    cells = cell_quality(data, g)
    n = len(q.ids)
    L = ["## Quality (GSM8K)", ""]
    L.append(f"- **Questions**: {n} from the GSM8K test split shipped with bmoe (sha256 "
             f"`{q.dataset_sha256[:16]}`): {_ids_text(q.ids)}. Every cell answers the same questions, greedy, "
             f"at most {data.plan.tokens} tokens per reply.")
    L.append(f"- **One engine process per run** answers all {n} questions in turn (`--prompts-file`): the model "
             f"and the expert cache stay loaded and warm across questions, the KV cache is cleared between "
             f"them; one CSV `turn` per question. Replies: `runs/<id>/replies.jsonl` (question id, the prompt "
             f"exactly as sent, the reply, tokens, times).")
    L.append(f"- **Grading rule** `{q.grader}` v{q.grader_version} (recorded in manifest.json before the first "
             f"reply; `bmoe-bench grade` regrades from the committed replies into grades.json): the number "
             f"after `####`, else in the last `\\boxed{{}}`, else the last number of the reply, reasoning "
             f"before `</think>` dropped, commas removed; correct when it equals the gold answer.")
    L += ["- **Prompt template** (the chat template, if `--chatml`, wraps it):", ""] + _fenced(q.template) + [""]
    L += ["| cell | correct | accuracy [95% CI, exact] | base right, cell wrong | cell right, base wrong | "
          "McNemar exact p | no number | stopped at -n | reply = base's |", "|---|---|---|---|---|---|---|---|---|"]
    base = next((x for x in cells if x.vs_base is None), None)
    for x in cells:
        m = x.vs_base
        nonum = sum(y.extracted is None for y in x.grades)
        limit = sum(r.stop == "limit" for r in x.replies)
        same = "" if base is None or x is base else \
            f"{sum(a.reply == b.reply for a, b in zip(x.replies, base.replies, strict=True))}/{n}"
        L.append(f"| {x.label} | {x.acc.correct}/{x.acc.n} | {_pct(x.acc.point)} [{_pct(x.acc.low)}, "
                 f"{_pct(x.acc.high)}] | {m.only_base if m else '(base)'} | {m.only_cell if m else ''} | "
                 f"{f'{m.p:.3g}' if m else ''} | {nonum} | {limit} | {same} |")
    L += ["", "Intervals are Clopper-Pearson (exact binomial, 95%); McNemar is the exact two-sided binomial test "
              "on the questions where the cell and the base disagree, on the same questions (scipy). *reply = base's*: "
              "questions whose reply is byte for byte the base cell's (a lossless knob must give all of them)."]
    agree = [x for x in cells if x.repeats_agree is False]
    if agree:
        L.append("Repeats of " + ", ".join(x.label for x in agree) + " gave different replies; the table uses "
                 "the first round of each cell.")
    L += ["", "### What this sample size can and cannot rule out", ""] + _power_lines(data, cells, n)
    L += ["", "### Questions whose grade differs between cells", ""] + _differences(cells)
    return L


def _ids_text(ids: list[str]) -> str:
    if ids == [gsm8k.question_id(i) for i in range(len(ids))]:
        return f"the first {len(ids)} (`{ids[0]}` .. `{ids[-1]}`)"
    return ", ".join(f"`{i}`" for i in ids)


def _power_lines(data: CampaignData, cells: list[CellQuality], n: int) -> list[str]:
    out = []
    m = min_discordant_for()
    if data.manifest.model.recipe:
        best = max((x.acc.correct for x in cells), default=0)
        chance = ("every cell answered 0" if best == 0 else
                  f"at most {best} of {n} correct in any cell, where a random number happened to equal the gold "
                  f"answer")
        out.append(f"- **The model is synthetic, with random weights**: its replies are noise and its accuracy "
                   f"is 0 up to chance ({chance}). This campaign shows the pipeline end to end (the questions, "
                   f"every reply committed, the grading, the statistics), not the quality of any real model or "
                   f"of any knob; the lines below say what the same numbers would mean for a real model.")
    elif cells and all(x.acc.correct == 0 for x in cells):
        out.append(f"- Every cell answered 0 of {n} correctly (exact 95% upper bound {_pct(cells[0].acc.high)}): "
                   f"check the template and the replies before reading anything into the comparison.")
    for x in cells:
        a = x.acc
        if _pct(a.low) != _pct(0.0):
            out.append(f"- **{x.label}**: {a.correct}/{a.n}; its true accuracy is within [{_pct(a.low)}, "
                       f"{_pct(a.high)}] (95%): a collapse below {_pct(a.low)} is ruled out, a change that "
                       f"stays inside that band of about {100 * (a.high - a.low):.0f} points is not.")
    out.append(f"- The exact McNemar test can reach p < 0.05 only when at least {m} questions change grade, all "
               f"the same way (the p-value counts only the questions where the two cells disagree); a knob that "
               f"changes fewer answers than that cannot be shown to cost anything here, whatever its true cost.")
    if n < m:
        out.append(f"- With {n} questions no difference between cells can be shown at all (fewer than {m}).")
    else:
        out.append(f"- So with {n} questions, even in the case most favourable to the test (every changed answer "
                   f"going the same way), a cost below {m} questions = {_pct(m / n)} of accuracy cannot be "
                   f"detected; a collapse can. A cost of a few points needs several hundred questions (the full "
                   f"split has 1319).")
    out.append("- One model, greedy decoding, one prompt template: other templates, sampling or models can rank "
               "the cells differently.")
    return out


def _differences(cells: list[CellQuality]) -> list[str]:
    if len(cells) < 2:
        return ["Only one cell has graded replies: nothing to compare."]
    base = cells[0]
    ids = [y.id for y in base.grades]
    out = []
    for i, qid in enumerate(ids):
        marks = [x.grades[i].correct for x in cells]
        if len(set(marks)) == 1:
            continue
        gold = base.grades[i].gold
        out.append(f"#### `{qid}` (gold {gold})")
        out.append("")
        for x in cells:
            gx = x.grades[i]
            verdict = "correct" if gx.correct else "wrong"
            got = f"answer {gx.extracted}, by {gx.how}" if gx.extracted is not None else "no number found"
            out.append(f"**{x.label}**: {verdict} ({got}; {x.replies[i].n_tokens} tokens)")
            out.append("")
            out += _fenced(x.replies[i].reply) + [""]
    if not out:
        return ["None: every question has the same grade in every cell."]
    return out
