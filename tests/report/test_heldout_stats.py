"""harness.quality.heldout: by-hand values, and known-truth simulations that every interval it prints as 95% holds
the truth about 95% of the time where its assumptions hold (and that the interval over positions would not, under
the within-chunk correlation real text has)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.quality.heldout import chunk_mean, heldout, paired, perplexity

T_975_2 = 4.302652729749464  # t(0.975, 2 degrees of freedom)
TRIALS = 3000
N_CHUNK, PER = 8, 40
CHUNK = np.repeat(np.arange(N_CHUNK), PER)


def test_by_hand():
    x = np.array([-0.5, -1.5, -2.0, -2.0, -3.0, -3.0])  # chunk means -1, -2, -3: mean -2, sd 1
    ch = np.array([0, 0, 1, 1, 2, 2])
    m = chunk_mean(x, ch)
    half = T_975_2 / math.sqrt(3)
    assert m.mean == -2.0 and m.n_chunks == 3
    assert m.low == pytest.approx(-2 - half) and m.high == pytest.approx(-2 + half)
    p = perplexity(x, ch)
    assert p.mean == pytest.approx(math.exp(2)) and p.low == pytest.approx(math.exp(2 - half))
    assert p.high == pytest.approx(math.exp(2 + half))
    one = chunk_mean(np.array([1.0, 2.0]), np.array([0, 0]))
    assert one.n_chunks == 1 and not one.has_interval
    h = heldout(x, np.array([1, 0, 1, 1, 0, 0]), ch)
    assert (h.acc.correct, h.acc.n, h.positions) == (3, 6, 6) and h.acc_chunks.mean == 0.5
    pr = paired(x, np.array([1, 1, 0, 0, 1, 1]), x + 0.25, np.array([1, 0, 1, 0, 1, 1]), ch)
    assert (pr.mcnemar.only_base, pr.mcnemar.only_cell, pr.mcnemar.p) == (1, 1, 1.0)
    assert pr.dlp.mean == 0.25 and pr.dlp.low == pytest.approx(0.25) and pr.dlp.high == pytest.approx(0.25)
    with pytest.raises(ValueError):
        paired(x, x > -2, x[:3], x[:3] > -2, ch)


def _clustered(rng: np.random.Generator, mean: float, sd_chunk: float, sd_pos: float) -> np.ndarray:
    return mean + np.repeat(rng.normal(0, sd_chunk, N_CHUNK), PER) + rng.normal(0, sd_pos, N_CHUNK * PER)


def test_perplexity_interval_covers_the_true_perplexity():
    """Log-probabilities with a chunk effect (texts differ in difficulty) and skewed per-position noise: the
    interval holds exp(-true mean) in 95% of trials (within 1.5 points)."""
    rng = np.random.default_rng(11)
    true_lp = -2.3
    hit = 0
    for _ in range(TRIALS):
        lp = true_lp + np.repeat(rng.normal(0, 0.4, N_CHUNK), PER) - (rng.exponential(1.0, N_CHUNK * PER) - 1.0)
        p = perplexity(lp, CHUNK)
        hit += p.low <= math.exp(-true_lp) <= p.high
    assert abs(hit / TRIALS - 0.95) < 0.015


def test_paired_difference_interval_covers_the_true_difference_and_positions_would_not():
    rng = np.random.default_rng(12)
    true_d = -0.05
    hit = naive = 0
    for _ in range(TRIALS):
        base = _clustered(rng, -2.0, 0.4, 1.0)
        cell = base + _clustered(rng, true_d, 0.05, 0.05)  # a knob's cost that varies by chunk
        iv = paired(base, base > -2, cell, cell > -2, CHUNK).dlp
        hit += iv.low <= true_d <= iv.high
        d = cell - base
        naive += abs(d.mean() - true_d) <= 1.96 * d.std(ddof=1) / math.sqrt(len(d))
    assert abs(hit / TRIALS - 0.95) < 0.015
    assert naive / TRIALS < 0.6


def test_accuracy_intervals_cover_where_their_assumptions_hold():
    """Clopper-Pearson over positions holds at least 95% for independent hits (it is exact, so conservative); the
    interval over chunks holds about 95% when hits share a chunk effect, where Clopper-Pearson falls short (why the
    findings print both)."""
    rng = np.random.default_rng(13)
    p_true = 0.4
    cp_ind = cp_clu = ch_clu = 0
    for _ in range(TRIALS):
        ind = rng.random(N_CHUNK * PER) < p_true
        a = heldout(np.zeros(len(ind)), ind, CHUNK).acc
        cp_ind += a.low <= p_true <= a.high
        rate = np.clip(p_true + rng.normal(0, 0.12, N_CHUNK), 0, 1)
        clu = rng.random(N_CHUNK * PER) < np.repeat(rate, PER)
        h = heldout(np.zeros(len(clu)), clu, CHUNK)
        cp_clu += h.acc.low <= p_true <= h.acc.high
        ch_clu += h.acc_chunks.low <= p_true <= h.acc_chunks.high
    assert cp_ind / TRIALS >= 0.945
    assert abs(ch_clu / TRIALS - 0.95) < 0.02
    assert cp_clu / TRIALS < 0.85
