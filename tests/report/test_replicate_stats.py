"""Replication statistics (harness.report.replicate_stats), pure: spread, per-comparison state and the campaign's
verdict line, on known numbers."""

from __future__ import annotations

import math

import pytest

from harness.report.replicate_stats import (
    INCOMPLETE,
    NOT_REPLICATED,
    REPLICATED,
    Comparison,
    spread,
    verdict,
)


def test_spread_both_ways():
    mm, rm = spread([1.0, 1.02, 1.05, 0.98, 1.01])
    assert mm == pytest.approx(100 * (1.05 / 0.98 - 1))  # 7.14%
    assert rm == pytest.approx(100 * (1.05 - 0.98) / 1.01)  # median of five: 1.01
    assert spread([2.0, 3.0]) == pytest.approx((50.0, 40.0))  # even count: median the mean of the middle two


@pytest.mark.parametrize("points", [[], [1.0], [1.0, 0.0], [1.0, math.nan], [1.0, -2.0], [1.0, math.inf]])
def test_spread_is_nan_without_two_usable_ratios(points):
    assert all(math.isnan(x) for x in spread(points))


def test_identical_tries_spread_zero_and_replicate():
    c = Comparison(None, "streamed", "mmap", (0.5, 0.5, 0.5), within_pct=5)
    assert c.spread_pct == 0 and c.state == REPLICATED and c.miss_pp == -5


def test_a_comparison_within_and_one_past_it():
    ok = Comparison("lo-a1", "streamed", "mmap", (1.00, 1.04, 1.02), within_pct=5)  # 4.0%
    bad = Comparison("lo-b1", "streamed", "mmap", (1.00, 1.10, 1.02), within_pct=5)  # 10.0%: missed by 5 pp
    assert ok.state == REPLICATED and ok.spread_pct == pytest.approx(4.0)
    assert bad.state == NOT_REPLICATED and bad.miss_pp == pytest.approx(5.0)
    v = verdict([ok, bad], tries=3, within_pct=5)
    assert v.state == NOT_REPLICATED and v.worst is bad and v.tries_done == 3
    assert v.line() == ("replicate: not replicated by 5.00 pp: spread 10.00% (max/min - 1) over 3 tries against 5% "
                        "asked (streamed / mmap on lo-b1)")


def test_exactly_at_the_limit_replicates():
    c = Comparison(None, "x", "base", (1.0, 1.25), within_pct=25)
    assert c.state == REPLICATED
    want = "replicate: replicated within 25% over 2 tries (widest spread 25.00%, x / base)"
    assert verdict([c], 2, 25).line() == want


def test_a_missing_try_leaves_it_incomplete_whatever_the_spread():
    a = Comparison("d1", "s", "m", (1.0, None, 1.0, 1.0, 1.0), within_pct=5)
    b = Comparison("d2", "s", "m", (1.0, 1.0, 1.0, None, None), within_pct=5)
    assert a.state == INCOMPLETE and a.done == 4 and b.done == 3
    v = verdict([a, b], tries=5, within_pct=5)
    assert v.state == INCOMPLETE and v.tries_done == 2  # tries 1 and 3 have every ratio
    assert v.line() == "replicate: incomplete: 2 of 5 tries have every ratio"
    assert verdict([], 5, 5).line() == "replicate: incomplete: 0 of 5 tries have every ratio"


def test_the_verdict_names_the_widest_comparison_when_all_replicate():
    a = Comparison("d1", "s", "m", (1.0, 1.01), within_pct=5)
    b = Comparison("d2", "s", "m", (1.0, 1.03), within_pct=5)
    v = verdict([a, b], 2, 5)
    assert v.state == REPLICATED and v.worst is b and v.miss_pp == pytest.approx(-2.0)
