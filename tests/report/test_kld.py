"""harness.kld (pure): the compact reference, KLD / same-top / Δp against it, and perplexity.cpp's statistics."""

from __future__ import annotations

import numpy as np
import pytest

from harness import kld


def _logits(n: int, v: int, seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, v)) * scale).astype(np.float32)


def _full_kld(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """KLD(softmax(a) || softmax(b)) per row over the whole vocabulary, in float64 (the textbook formula)."""
    la = a.astype(np.float64) - np.logaddexp.reduce(a.astype(np.float64), axis=1, keepdims=True)
    lb = b.astype(np.float64) - np.logaddexp.reduce(b.astype(np.float64), axis=1, keepdims=True)
    return (np.exp(la) * (la - lb)).sum(axis=1)


def test_identical_logits_give_exactly_zero_and_the_same_top():
    x = _logits(50, 300, 1)
    nxt = np.arange(50) % 300
    for k in (1, 8, 300):
        c = kld.compact(x, nxt, k)
        a = kld.against(c, x.copy(), nxt)
        assert np.all(a.kld == 0.0) and np.all(a.same_top) and np.all(a.dp == 0.0)
        assert np.array_equal(a.next_lp, c.next_lp.astype(np.float64))  # the same float32 value both sides


def test_the_run_s_next_token_log_probability():
    ref, run = _logits(30, 100, 6), _logits(30, 100, 7)
    nxt = (np.arange(30) * 7) % 100
    a = kld.against(kld.compact(ref, nxt, 10), run, nxt)
    lse = np.log(np.exp(run.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(a.next_lp, run[np.arange(30), nxt] - lse, rtol=1e-6)
    assert np.array_equal(a.run_top, run.argmax(axis=1))


def test_whole_vocabulary_gives_the_textbook_kld():
    ref, run = _logits(40, 200, 2), _logits(40, 200, 3)
    nxt = np.arange(40)
    a = kld.against(kld.compact(ref, nxt, 200), run, nxt)
    np.testing.assert_allclose(a.kld, _full_kld(ref, run), rtol=2e-5, atol=1e-7)


def test_top_k_is_a_lower_bound_that_grows_to_the_full_kld():
    ref = _logits(60, 500, 4)
    run = ref + _logits(60, 500, 5, scale=0.7)
    nxt = np.arange(60)
    full = _full_kld(ref, run)
    prev = np.zeros(60)
    for k in (1, 4, 16, 64, 256, 500):
        a = kld.against(kld.compact(ref, nxt, k), run, nxt)
        assert np.all(a.kld <= full + 1e-6)
        assert np.all(a.kld >= prev - 1e-6)
        prev = a.kld
    np.testing.assert_allclose(prev, full, rtol=2e-5, atol=1e-7)


def test_compact_keeps_the_most_probable_first_ties_by_lower_id():
    x = np.array([[1.0, 3.0, 3.0, 0.0, 2.0]], dtype=np.float32)
    c = kld.compact(x, np.array([4]), 3)
    assert c.ids.tolist() == [[1, 2, 4]]
    p = np.exp(x[0].astype(np.float64) - np.logaddexp.reduce(x[0].astype(np.float64)))
    np.testing.assert_allclose(np.exp(c.lp[0]), p[[1, 2, 4]], rtol=1e-6)
    np.testing.assert_allclose(np.exp(c.tail_lp[0]), p[0] + p[3], rtol=1e-5)
    np.testing.assert_allclose(np.exp(c.next_lp[0]), p[4], rtol=1e-6)
    assert np.isneginf(kld.compact(x, np.array([0]), 5).tail_lp[0])


def test_same_top_and_dp_follow_the_run():
    ref = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]], dtype=np.float32)
    run = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]], dtype=np.float32)
    nxt = np.array([2, 0])
    a = kld.against(kld.compact(ref, nxt, 3), run, nxt)
    assert a.same_top.tolist() == [False, True] and a.run_top.tolist() == [2, 0]
    p = lambda x, i: float(np.exp(x[i] - np.logaddexp.reduce(x.astype(np.float64))))  # noqa: E731
    assert a.dp[0] == pytest.approx(p(run[0], 2) - p(ref[0], 2), rel=1e-6)
    assert a.dp[1] == 0.0 and a.kld[1] == 0.0 and a.kld[0] > 0


def test_rows_must_match():
    x = _logits(3, 10, 6)
    with pytest.raises(ValueError):
        kld.against(kld.compact(x, np.zeros(3, int), 4), x[:2], np.zeros(2, int))


# -- the statistics: perplexity.cpp's formulas, recomputed by hand ---------------------------------------------


def test_mean_and_uncertainty_and_percentile_as_perplexity_cpp():
    x = np.arange(1.0, 21.0)  # 1..20
    m, se = kld.mean_and_uncertainty(x)
    assert m == 10.5
    assert se == pytest.approx(np.sqrt((np.mean(x * x) - 10.5**2) / 19))
    assert kld.mean_and_uncertainty(x[:10])[1] == 0.0  # perplexity.cpp: no uncertainty for 10 values or fewer
    v = np.array([0.0, 1.0, 2.0, 10.0])
    assert kld.percentile(v, 0.5) == pytest.approx(1.5)  # rank 1.5: halfway between 1 and 2
    assert kld.percentile(v, 0.99) == pytest.approx(v[2] + 0.97 * (v[3] - v[2]))
    assert kld.percentile(v, 0.0) == 0.0 and kld.percentile(v, 1.0) == 10.0
    assert kld.median(v) == 1.5 and kld.median(v[:3]) == 1.0


def _against(n: int, seed: int) -> kld.Against:
    rng = np.random.default_rng(seed)
    return kld.Against(kld=rng.exponential(0.1, n), same_top=rng.random(n) < 0.9, dp=rng.normal(0, 0.05, n),
                       run_top=np.zeros(n, int), next_lp=np.zeros(n))


def test_summary_figures():
    a = _against(400, 7)
    s = kld.summarize(a)
    assert s.enough and s.positions == 400
    assert s.kld_mean == pytest.approx(a.kld.mean())
    assert s.kld_se == pytest.approx(a.kld.std() / np.sqrt(399), rel=1e-9)
    same = a.same_top.mean()
    assert s.same_top == same and s.same_top_se == pytest.approx(np.sqrt(same * (1 - same) / 399))
    assert s.dp_rms == pytest.approx(np.sqrt(np.mean(a.dp**2)))
    srt = np.sort(a.kld.astype(np.float32))
    assert s.kld_pct[99.0] == pytest.approx(kld.percentile(srt, 0.99)) and s.kld_max == pytest.approx(srt[-1])
    assert set(s.kld_pct) == set(kld.KLD_PERCENTILES) and set(s.dp_pct) == set(kld.DP_PERCENTILES)
    detail = kld.detail_lines(s)
    assert len(detail) == 3 and f"p99={s.kld_pct[99.0]:.6g}" in detail[0] and "p0.1=" in detail[2]
    line = s.line()
    assert line.startswith(f"fidelity: kld_mean={s.kld_mean:.6g} kld_p99={s.kld_pct[99.0]:.6g} "
                           f"same_top_pct={100 * same:.4g} positions=400")


def test_no_statistics_below_100_positions():
    s = kld.summarize(_against(99, 8))
    assert not s.enough and s.kld_pct is None and s.kld_se is None and s.dp_rms is None
    assert kld.detail_lines(s) == []
    assert "kld_p99=n/a" in s.line() and "no statistics below 100 positions" in s.line()
    with pytest.raises(ValueError):
        kld.summarize(_against(0, 9))


def test_covered_is_the_mass_the_top_k_hold():
    x = np.array([[0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert kld.covered(kld.compact(x, np.array([0]), 3).tail_lp) == pytest.approx((0.75, 0.75))
    assert kld.covered(kld.compact(x, np.array([0]), 4).tail_lp) == (1.0, 1.0)


def test_chunk_interval_by_hand_and_its_refusals():
    from harness.kld import chunk_interval

    # chunk means 1, 2, 3 (two positions each): mean 2, sd 1, t(0.975, 2) = 4.302652729749464
    kld = np.array([0.5, 1.5, 2.0, 2.0, 3.0, 3.0])
    iv = chunk_interval(kld, np.array([0, 0, 1, 1, 2, 2]))
    half = 4.302652729749464 / np.sqrt(3)
    assert iv.n_chunks == 3 and iv.mean == 2.0
    assert abs(iv.high - (2 + half)) < 1e-9 and iv.low == 0.0  # 2 - 2.48 clipped: a KLD is never negative
    one = chunk_interval(np.array([0.1, 0.2]), np.array([0, 0]))
    assert one.n_chunks == 1 and np.isnan(one.low) and np.isnan(one.high)
    zero = chunk_interval(np.zeros(8), np.repeat(np.arange(4), 2))
    assert (zero.mean, zero.low, zero.high) == (0.0, 0.0, 0.0)


def test_chunk_interval_covers_the_true_mean_95_percent_of_the_time():
    """Calibration: chunks whose positions are correlated within a chunk (a shared chunk effect) and independent
    between chunks; the t interval over chunks covers the true mean in 95% of 4000 trials (within 1.5 points),
    where an interval over positions (as if independent) would cover far less."""
    from harness.kld import chunk_interval

    rng = np.random.default_rng(7)
    n_chunk, per, true = 8, 50, 1.0
    chunk = np.repeat(np.arange(n_chunk), per)
    hit = naive = 0
    for _ in range(4000):
        x = true + np.repeat(rng.normal(0, 0.3, n_chunk), per) + rng.normal(0, 0.3, n_chunk * per)
        iv = chunk_interval(x, chunk)
        hit += iv.low <= true <= iv.high
        se = x.std(ddof=1) / np.sqrt(len(x))
        naive += abs(x.mean() - true) <= 1.96 * se
    assert abs(hit / 4000 - 0.95) < 0.015
    assert naive / 4000 < 0.6
