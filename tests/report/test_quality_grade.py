"""The GSM8K grading rule on fixture replies with known answers (units, commas, several numbers, no number,
`####` lines, boxed, reasoning), the shipped split's gold answers, and the statistics against known values."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.quality import gsm8k
from harness.quality.grade import GRADER_VERSION, extract, grade
from harness.quality.stats import accuracy, clopper_pearson, mcnemar_exact, min_discordant_for

CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "quality" / "replies.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_grader_on_fixture_replies(case):
    g = grade(case["reply"], Decimal(case["gold"]))
    assert (g.extracted, g.how, g.correct) == (case["extracted"], case["how"], case["correct"])


def test_grader_version_is_recorded():
    assert GRADER_VERSION == 1  # a change of the rule must bump this (the manifest records it)


def test_gold_answers_of_the_shipped_split():
    qs = gsm8k.questions()
    assert len(qs) == 1319
    assert qs[0].gold == 18 and qs[0].id == "gsm8k-test-0000"
    assert gsm8k.by_id("gsm8k-test-0001").gold == 3
    assert all(q.gold == Decimal(q.solution.rsplit("####", 1)[1].strip().replace(",", "")) for q in qs)
    # the solutions' own last line, graded, is right: the rule agrees with the data's format
    assert all(grade(q.solution, q.gold).correct for q in qs)
    with pytest.raises(UserError, match="not a GSM8K test question"):
        gsm8k.by_id("gsm8k-test-9999")


def test_select_and_render():
    assert [q.id for q in gsm8k.select(3, None)] == ["gsm8k-test-0000", "gsm8k-test-0001", "gsm8k-test-0002"]
    assert [q.index for q in gsm8k.select(None, [5, 2])] == [5, 2]
    with pytest.raises(UserError, match="1319"):
        gsm8k.select(None, [1319])
    q = gsm8k.questions()[1]
    assert gsm8k.render("Q: {question}\nA {x}:", q) == f"Q: {q.question}\nA {{x}}:"


def test_the_data_ships_inside_the_package_with_its_licence():
    import harness

    d = Path(harness.__file__).parent / "data" / "gsm8k"
    assert (d / "test.jsonl").is_file() and "MIT License" in (d / "LICENSE").read_text()
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"data/gsm8k/test.jsonl"' in pyproject and '"data/gsm8k/LICENSE"' in pyproject


def test_extract_prefers_hashes_then_boxed_then_last():
    assert extract("1 \\boxed{2} 3\n#### 4 5") == ("4", "####")
    assert extract("1 \\boxed{2} 3") == ("2", "boxed")
    assert extract("1 \\boxed{x} 3") == ("3", "last number")


def test_clopper_pearson_known_values():
    # published exact intervals: 0/10 -> [0, 0.3085]; 5/10 -> [0.1871, 0.8129]; 10/10 -> [0.6915, 1]
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 0.30850), abs=1e-5)
    assert clopper_pearson(5, 10) == pytest.approx((0.18709, 0.81291), abs=1e-5)
    assert clopper_pearson(10, 10) == pytest.approx((0.69150, 1.0), abs=1e-5)
    assert clopper_pearson(0, 100)[1] == pytest.approx(0.03622, abs=1e-5)  # the "rule of three" ~ 3/n
    lo, hi = clopper_pearson(50, 100)
    assert (lo, hi) == pytest.approx((0.39832, 0.60168), abs=1e-5)
    a = accuracy([True, False, False, True])
    assert (a.correct, a.n, a.point) == (2, 4, 0.5)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_mcnemar_exact_known_values():
    # b=1, c=9: p = 2 * P[X <= 1 | n=10] = 2 * 11/1024
    base = [True] + [False] * 9 + [True] * 5
    cell = [False] + [True] * 9 + [True] * 5
    m = mcnemar_exact(base, cell)
    assert (m.only_base, m.only_cell, m.discordant) == (1, 9, 10)
    assert m.p == pytest.approx(22 / 1024)
    # b=0, c=6: 2 / 64 = 0.03125 < 0.05 ; b=0, c=5: 2 / 32 = 0.0625
    assert mcnemar_exact([False] * 6, [True] * 6).p == pytest.approx(0.03125)
    assert mcnemar_exact([False] * 5, [True] * 5).p == pytest.approx(0.0625)
    assert mcnemar_exact([True, False], [True, False]).p == 1.0  # no discordant pair
    assert mcnemar_exact([True, False], [False, True]).p == 1.0  # b=c=1: capped at 1
    assert min_discordant_for(0.05) == 6
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])
