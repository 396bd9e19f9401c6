"""Held-out text quality from per-position records (pure numpy/scipy; the records are bmoe_fidelity v2 rows, one
per scored position: its chunk, the log-probability of the text's next token, whether the most probable token was
that one): perplexity, next-token accuracy, and a cell against the base on the same positions.

Positions of one chunk share its context, so they are not independent; chunks are separate windows of the text,
each decoded from an empty KV cache. Hence:
- perplexity = exp(-mean log-probability) with a 95% t interval over chunks (each chunk's mean log-probability is
  one observation; every chunk scores as many positions, so the mean of the chunk means is the mean over all
  positions), mapped through exp (monotone: the interval's coverage is the mean's);
- next-token accuracy: hits / positions with the exact Clopper-Pearson interval (harness.quality.stats), exact when
  positions are independent, and beside it the t interval over chunks of the hit rate, which holds when they are
  not (read that one when the two differ);
- a cell against the base: the exact McNemar test on the per-position hits (the positions as pairs; the same
  independence caveat), and a 95% paired t interval over chunks of the mean log-probability difference
  (cell - base; negative: the cell finds the text less likely).
tests/report/test_heldout_stats.py checks the coverage of every t interval here on known-truth simulations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.quality.stats import Accuracy, McNemar, accuracy, mcnemar_exact

CONFIDENCE = 0.95


@dataclass(frozen=True)
class ChunkMean:
    """A mean with a t interval over chunks (low = high = nan below two chunks)."""

    mean: float
    low: float
    high: float
    n_chunks: int
    confidence: float = CONFIDENCE

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low)


def chunk_mean(x: np.ndarray, chunk: np.ndarray, confidence: float = CONFIDENCE) -> ChunkMean:
    """mean ± t(confidence, n-1) · sd(chunk means) / √n over the n chunks; the point is the mean over positions."""
    from scipy.special import stdtrit

    x, chunk = np.asarray(x, dtype=np.float64), np.asarray(chunk)
    if len(x) != len(chunk):
        raise ValueError(f"{len(x)} values against {len(chunk)} chunk ids")
    ids = np.unique(chunk)
    mean = float(x.mean()) if len(x) else math.nan
    if len(ids) < 2:
        return ChunkMean(mean, math.nan, math.nan, len(ids), confidence)
    means = np.array([x[chunk == c].mean() for c in ids])
    half = float(stdtrit(len(ids) - 1, 0.5 + confidence / 2)) * float(means.std(ddof=1)) / math.sqrt(len(ids))
    return ChunkMean(mean, mean - half, mean + half, len(ids), confidence)


def perplexity(lp: np.ndarray, chunk: np.ndarray, confidence: float = CONFIDENCE) -> ChunkMean:
    """exp(-mean lp) and its interval: exp(-high), exp(-low) of the mean log-probability's interval over chunks."""
    m = chunk_mean(lp, chunk, confidence)
    return ChunkMean(math.exp(-m.mean), math.exp(-m.high) if m.has_interval else math.nan,
                     math.exp(-m.low) if m.has_interval else math.nan, m.n_chunks, confidence)


@dataclass(frozen=True)
class HeldOut:
    """One cell's figures on the text: positions, perplexity, accuracy (Clopper-Pearson) and the hit rate over
    chunks, the mean log-probability (nats)."""

    positions: int
    ppl: ChunkMean
    acc: Accuracy
    acc_chunks: ChunkMean
    mean_lp: float


def heldout(lp: np.ndarray, hit: np.ndarray, chunk: np.ndarray) -> HeldOut:
    lp = np.asarray(lp, dtype=np.float64)
    if not len(lp):
        raise ValueError("no positions")
    hits = [bool(h) for h in np.asarray(hit)]
    return HeldOut(len(lp), perplexity(lp, chunk), accuracy(hits), chunk_mean(np.asarray(hits, float), chunk),
                   float(lp.mean()))


@dataclass(frozen=True)
class Paired:
    """A cell against the base on the same positions: McNemar on the hits, and the mean log-probability difference
    (cell - base, nats) with its paired interval over chunks."""

    mcnemar: McNemar
    dlp: ChunkMean


def paired(lp_base: np.ndarray, hit_base: np.ndarray, lp_cell: np.ndarray, hit_cell: np.ndarray,
           chunk: np.ndarray) -> Paired:
    if not len(lp_base) == len(lp_cell) == len(hit_base) == len(hit_cell) == len(chunk):
        raise ValueError("paired figures need the same positions in both")
    d = np.asarray(lp_cell, dtype=np.float64) - np.asarray(lp_base, dtype=np.float64)
    return Paired(mcnemar_exact([bool(h) for h in hit_base], [bool(h) for h in hit_cell]), chunk_mean(d, chunk))
