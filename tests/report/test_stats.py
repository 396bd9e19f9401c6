"""harness.stats against fixtures whose answers are known in closed form or by construction."""

import numpy as np
import pytest

from harness import stats
from harness.stats import RunPoint


def test_tok_s_is_tokens_over_summed_wall_time():
    assert stats.tok_s(np.array([100.0, 200.0, 300.0, 400.0])) == pytest.approx(4.0)  # 4 tokens in 1 s
    assert np.isnan(stats.tok_s(np.array([])))


def test_trim_drops_warmup_tokens():
    assert list(stats.trim(np.array([9.0, 8, 1, 2]), 2)) == [1.0, 2.0]


def test_identical_runs_give_a_zero_width_interval_over_runs():
    runs = [np.full(10, 250.0)] * 3  # 4 tok/s each
    iv = stats.cell_interval(runs, seed=1)
    assert iv.basis == "runs" and iv.n == 3
    assert (iv.point, iv.low, iv.high) == pytest.approx((4.0, 4.0, 4.0))


def test_single_run_has_no_interval_between_runs_only_its_within_run_spread():
    iv = stats.cell_interval([np.array([200.0, 250.0, 300.0, 250.0, 250.0])], seed=1)
    assert iv.basis == "tokens" and iv.n == 5 and not iv.between_runs
    assert iv.method == stats.ONE_RUN == "one run: spread between runs unknown"
    assert iv.half_width == float("inf")  # never precise
    assert iv.point == pytest.approx(5 / 1.25)
    assert iv.low <= iv.point <= iv.high
    # the slowest possible resample is all 300 ms tokens, the fastest all 200 ms
    assert 1000 / 300 <= iv.low and iv.high <= 1000 / 200


def test_within_run_spread_is_seeded_and_reproducible_and_runs_need_no_seed():
    rng = np.random.default_rng(0)
    one = [rng.normal(250, 20, 16)]
    assert stats.cell_interval(one, seed=7) == stats.cell_interval(one, seed=7)
    assert stats.cell_interval(one, seed=7) != stats.cell_interval(one, seed=8)
    runs = [rng.normal(250, 20, 16) for _ in range(12)]
    assert stats.cell_interval(runs, seed=7) == stats.cell_interval(runs, seed=8)  # a t interval: no resampling


def test_t_interval_over_two_runs_in_closed_form():
    # 4 and 6 tok/s: mean 5, sd sqrt(2), standard error relative to the mean 0.2; t(1 df) = 12.706
    iv = stats.cell_interval([np.full(4, 250.0), np.full(6, 1000 / 6)], seed=0)
    assert iv.method == stats.T_RUNS and iv.basis == "runs" and iv.n == 2
    q = 12.7062047 * 0.2
    assert (iv.point, iv.low, iv.high) == pytest.approx((5.0, 5 * np.exp(-q), 5 * np.exp(q)))


def test_paired_ratio_cancels_what_a_round_shares():
    # the machine runs 1x, 2x, 0.5x as fast in rounds 0, 1, 2; the cell is always exactly 1.5x the base
    speed = [1.0, 2.0, 0.5]
    base = stats.CellRuns.of([np.full(5, 100.0 / s) for s in speed], [0, 1, 2])
    cell = stats.CellRuns.of([np.full(5, 100.0 / s / 1.5) for s in speed], [0, 1, 2])
    iv = stats.ratio_interval(cell, base, seed=0)
    assert iv.method == stats.T_PAIRED and iv.basis == "rounds" and iv.n == 3
    assert (iv.point, iv.low, iv.high) == pytest.approx((1.5, 1.5, 1.5))
    un = iv.unpaired  # the same runs taken apart: the rounds' spread lands in the interval
    assert un.method == stats.T_UNPAIRED and un.point == pytest.approx(1.5) and un.low < 1.0 and un.high > 2.2
    # rounds the base lacks: paired over the two rounds both have
    part = stats.ratio_interval(cell, stats.CellRuns.of(list(base.walls[:2]), [0, 1]), seed=0)
    assert part.method == stats.T_PAIRED and part.n == 2
    # fewer than two common rounds: unpaired, and it says so
    apart = stats.ratio_interval(stats.CellRuns.of(list(cell.walls[:2]), [0, 1]),
                                 stats.CellRuns.of(list(base.walls[1:]), [1, 2]), seed=0)
    assert apart.method == stats.T_UNPAIRED and apart.unpaired is None


def test_precision_reached_reads_the_sequential_interval():
    rng = np.random.default_rng(3)
    base = [np.full(4, 100.0 * f) for f in rng.normal(1, 0.02, 6)]
    cell = [np.full(4, 50.0 * f) for f in rng.normal(1, 0.02, 6)]
    iv = stats.ratio_interval(stats.CellRuns.of(cell, list(range(6))), stats.CellRuns.of(base, list(range(6))), 0)
    seq = iv.sequential()
    assert seq.point == iv.point and seq.low < iv.low and seq.high > iv.high and stats.SEQUENTIAL in seq.method
    assert stats.precision_reached([iv], seq.half_width + 1e-9)
    assert not stats.precision_reached([iv], seq.half_width * 0.99)
    assert not stats.precision_reached([iv, None], 1.0)  # a cell without a ratio is never precise


def test_cell_interval_covers_the_true_mean_about_95_percent_of_the_time():
    # per-run tok/s ~ Normal(10, 1): the true mean of the cell is 10
    rng = np.random.default_rng(123)
    hits, trials = 0, 200
    for t in range(trials):
        rates = rng.normal(10.0, 1.0, 20)
        runs = [np.array([1000.0 / r]) for r in rates]  # one token per run at that rate
        iv = stats.cell_interval(runs, seed=t)
        hits += iv.contains(10.0)
    assert 0.88 <= hits / trials <= 0.99


def test_ratio_of_constant_cells_is_exact():
    base = [np.full(8, 500.0)] * 3  # 2 tok/s
    fast = [np.full(8, 250.0)] * 3  # 4 tok/s
    iv = stats.ratio_interval(fast, base, seed=3)
    assert iv.basis == "runs"
    assert (iv.point, iv.low, iv.high) == pytest.approx((2.0, 2.0, 2.0))


def test_ratio_of_single_runs_is_their_within_run_spread():
    iv = stats.ratio_interval([np.full(8, 100.0)], [np.full(8, 300.0)], seed=3)
    assert iv.basis == "tokens" and iv.point == pytest.approx(3.0) and iv.method == stats.ONE_RUN


def test_ratio_interval_covers_the_true_ratio():
    # cell ~ N(15, 1), base ~ N(10, 1) tok/s per run: true ratio of means is 1.5
    rng = np.random.default_rng(5)
    hits, trials = 0, 150
    for t in range(trials):
        a = [np.array([1000.0 / r]) for r in rng.normal(15.0, 1.0, 20)]
        b = [np.array([1000.0 / r]) for r in rng.normal(10.0, 1.0, 20)]
        hits += stats.ratio_interval(a, b, seed=t).contains(1.5)
    assert 0.87 <= hits / trials <= 0.99


def test_intervals_overlap():
    a = stats.Interval(1, 0.9, 1.1, "runs", 3)
    assert a.overlaps(stats.Interval(1.2, 1.05, 1.3, "runs", 3))
    assert not a.overlaps(stats.Interval(1.3, 1.2, 1.4, "runs", 3))


def _pts(first, last, cells=("a", "b")):
    out = []
    for i, c in enumerate(cells):
        out.append(RunPoint(cell=c, round=0, position=i, tok_s=first))
        out.append(RunPoint(cell=c, round=2, position=10 + i, tok_s=last))
    return out


def test_drift_between_first_and_last_round_is_flagged_with_a_remedy():
    f = stats.drift_check(_pts(10.0, 8.0))
    assert f is not None and f.kind == "drift"
    assert "-20.0%" in f.message and "cooldown" in f.message
    assert stats.drift_check(_pts(10.0, 10.2)) is None


def test_throttling_from_entry_frequency_and_temperature():
    pts = [RunPoint("a", 0, 0, 5, entry_cpu_temp_c=40, entry_freq_frac=1.0),
           RunPoint("b", 0, 1, 5, entry_cpu_temp_c=48, entry_freq_frac=0.8)]
    f = stats.throttle_check(pts)
    assert f is not None and "80%" in f.message and "8.0 C" in f.message
    calm = [RunPoint("a", 0, 0, 5, entry_cpu_temp_c=40, entry_freq_frac=1.0),
            RunPoint("b", 0, 1, 5, entry_cpu_temp_c=41, entry_freq_frac=1.0)]
    assert stats.throttle_check(calm) is None


def test_variance_and_few_runs():
    assert stats.variance_check("x", [10, 10.1, 9.9]) is None
    f = stats.variance_check("x", [10, 14, 7])
    assert f is not None and "add repeats" in f.message
    assert stats.few_runs_check("x", 3) is None
    assert "repeats: 3" in stats.few_runs_check("x", 1).message
    assert "spread between runs is unknown" in stats.few_runs_check("x", 1).message


def test_freq_fraction():
    cf = {"policy0": {"scaling_max_khz": 1_900_800, "cpuinfo_max_khz": 3_321_600},
          "policy6": {"scaling_max_khz": 3_801_600, "cpuinfo_max_khz": 3_801_600}}
    assert stats.freq_fraction(cf) == pytest.approx(1_900_800 / 3_321_600)
    assert stats.freq_fraction({}) is None
