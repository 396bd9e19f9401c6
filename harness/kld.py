"""How far a run's next-token distributions moved from a reference run's on the same tokens (pure numpy, no
llama.cpp): the compact form a reference keeps per scored position, the per-position figures of a run against it,
and their summary with the definitions of llama.cpp's tools/perplexity/perplexity.cpp (`--kl-divergence`) at the
llama.cpp that the pinned llama-cpp-python vendors.

The compact form (harness.formats.fidelity stores it): per position the reference's top K tokens, their
log-probabilities (float32), the log of the remaining (tail) probability mass, and the log-probability of the
text's next token. KLD(ref||run) is then computed over K + 1 outcomes (the K tokens and the tail as one): by the
log-sum inequality this is at most the full-vocabulary KLD, and equal to it when K is the vocabulary (no tail).
Every log-probability of both sides goes through the same float32 rounding, so a run whose logits are
bit-identical to the reference's gives KLD exactly 0, Δp exactly 0 and the same top token.

Differences from llama.cpp's figures, all deliberate:
- llama.cpp stores the whole vocabulary as uint16 log-probabilities over [max-16, max] (scaled per row) and
  skips base log-probabilities at or below -16 in the sum; here the top K are float32 and the rest is one tail
  outcome (`tail_lp`). Identical logits give exactly 0 here, ~1e-6 there (its quantisation).
- llama.cpp's next-token probability of the base comes from the quantised row; here from float32.
Everything else (mean and its standard error, percentiles with linear interpolation, median, same-top share and
its binomial error, Δp mean, RMS and percentiles, no statistics below 100 positions) follows perplexity.cpp.

Stays at the root because the engine (run/fidelity) and report/ both compute with it; it imports neither."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_POSITIONS = 100  # perplexity.cpp: "we do not wish to do statistics on so few values"
KLD_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 10.0, 5.0, 1.0, 0.1)
DP_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 75.0, 25.0, 10.0, 5.0, 1.0, 0.1)


def _f32(x: np.ndarray) -> np.ndarray:
    """The one rounding both sides go through: float64 -> float32 -> float64."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


@dataclass
class _Norm:
    """One pass over rows of logits, as perplexity.cpp's log_softmax: x (n, V) float32, e = expf(x - max) (float32),
    s = their sum in double, lse = max + log(s): log p_i = x_i - lse."""

    x: np.ndarray
    e: np.ndarray
    s: np.ndarray
    lse: np.ndarray

    @classmethod
    def of(cls, logits: np.ndarray) -> _Norm:
        x = np.asarray(logits, dtype=np.float32)
        m = x.max(axis=1)
        e = np.exp(x - m[:, None])
        s = e.sum(axis=1, dtype=np.float64)
        return cls(x, e, s, m.astype(np.float64) + np.log(s))

    def lp_at(self, ids: np.ndarray) -> np.ndarray:
        """log p of ids (n, K) per row, float64."""
        return np.take_along_axis(self.x, ids, axis=1).astype(np.float64) - self.lse[:, None]

    def tail_lp(self, ids: np.ndarray) -> np.ndarray:
        """log of the mass outside ids per row (-inf when ids leave none: the whole vocabulary, or rounding)."""
        if ids.shape[1] >= self.x.shape[1]:
            return np.full(self.x.shape[0], -np.inf)
        rest = self.s - np.take_along_axis(self.e, ids, axis=1).sum(axis=1, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(rest > 0, np.log(np.maximum(rest, 0.0) / self.s), -np.inf)


@dataclass
class Compact:
    """The reference's compact rows: ids (n, K) int32 best first, lp (n, K) float32, tail_lp (n,) float32,
    next_lp (n,) float32 (the text's next token)."""

    ids: np.ndarray
    lp: np.ndarray
    tail_lp: np.ndarray
    next_lp: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def compact(logits: np.ndarray, next_tokens: np.ndarray, k: int) -> Compact:
    """Rows of logits (n, V) and the token following each row -> the compact form with the top k (k >= V: all),
    most probable first, ties by lower id (so the first is llama.cpp's argmax, the first maximum)."""
    nm = _Norm.of(logits)
    n, v = nm.x.shape
    k = min(k, v)
    part = np.argpartition(nm.x, v - k, axis=1)[:, v - k:] if k < v else np.broadcast_to(np.arange(v), (n, v))
    sel = np.take_along_axis(nm.x, part, axis=1)
    order = np.lexsort((part, -sel), axis=1)  # by descending logit, then ascending id
    ids = np.take_along_axis(part, order, axis=1).astype(np.int64)
    nxt = np.asarray(next_tokens, dtype=np.int64)[:, None]
    return Compact(ids=ids.astype(np.int32), lp=nm.lp_at(ids).astype(np.float32),
                   tail_lp=nm.tail_lp(ids).astype(np.float32), next_lp=nm.lp_at(nxt)[:, 0].astype(np.float32))


def covered(tail_lp: np.ndarray) -> tuple[float, float]:
    """How much of the reference's probability its top K hold: (mean, least) over positions, as fractions. KLD
    over the top K and the tail is the full KLD less tail mass x the tail's own divergence, so it is exact where
    the top K hold everything and says little where they hold little (a flat distribution)."""
    kept = 1.0 - np.exp(np.asarray(tail_lp, dtype=np.float64))
    return float(kept.mean()), float(kept.min())


@dataclass
class Against:
    """Per position: KLD(ref||run) in nats, whether the top token is the same, Δp = p_run - p_ref of the next
    token (a probability, not %), the run's top token and its log-probability of the next token (float32-rounded,
    as the reference's next_lp)."""

    kld: np.ndarray
    same_top: np.ndarray
    dp: np.ndarray
    run_top: np.ndarray
    next_lp: np.ndarray


def against(ref: Compact, logits: np.ndarray, next_tokens: np.ndarray) -> Against:
    """The run's rows of logits (n, V) scored against the reference's compact rows for the same positions."""
    nm = _Norm.of(logits)
    n = nm.x.shape[0]
    if len(ref) != n:
        raise ValueError(f"{len(ref)} reference rows against {n} run rows")
    ids = ref.ids.astype(np.int64)
    lp_ref, lq = ref.lp.astype(np.float64), _f32(nm.lp_at(ids))
    kld = (np.exp(lp_ref) * (lp_ref - lq)).sum(axis=1)
    tail_ref = ref.tail_lp.astype(np.float64)
    has_tail = np.isfinite(tail_ref)
    if has_tail.any():
        tail_run = _f32(nm.tail_lp(ids))
        with np.errstate(invalid="ignore"):
            term = np.exp(tail_ref) * (tail_ref - tail_run)
        kld = kld + np.where(has_tail, term, 0.0)
    run_top = nm.x.argmax(axis=1)
    nxt = np.asarray(next_tokens, dtype=np.int64)[:, None]
    lp_run = _f32(nm.lp_at(nxt)[:, 0])
    dp = np.exp(lp_run) - np.exp(ref.next_lp.astype(np.float64))
    return Against(kld=kld, same_top=run_top == ref.ids[:, 0], dp=dp, run_top=run_top, next_lp=lp_run)


# -- the summary (perplexity.cpp's definitions) ---------------------------------------------------------------


def mean_and_uncertainty(x: np.ndarray) -> tuple[float, float]:
    """perplexity.cpp's mean_and_uncertainty: the mean and sqrt((E[x^2] - mean^2) / (n - 1)), 0 for n <= 10."""
    n = len(x)
    if n < 1:
        return 0.0, 0.0
    f = float(np.sum(x) / n)
    df = float(np.sum(np.square(x)) / n) - f * f
    return f, (float(np.sqrt(df / (n - 1))) if df > 0 and n > 10 else 0.0)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """perplexity.cpp's percentile: linear interpolation between the two ranks around fraction * (n - 1)."""
    v = sorted_values
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = fraction * (len(v) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * v[i] + p * v[min(i + 1, len(v) - 1)])


def median(sorted_values: np.ndarray) -> float:
    v, n = sorted_values, len(sorted_values)
    return float(0.5 * (v[n // 2] + v[n // 2 - 1]) if n % 2 == 0 else v[n // 2])


@dataclass(frozen=True)
class FidelityStats:
    """The summary of n positions; the distribution figures are None below MIN_POSITIONS (say so, as
    perplexity.cpp prints none). KLD in nats; same_top and Δp as fractions (x100 for %)."""

    positions: int
    kld_mean: float
    kld_max: float
    same_top: float
    kld_se: float | None = None
    kld_median: float | None = None
    kld_pct: dict[float, float] | None = None  # percentile (99.9 ... 0.1) -> value
    kld_min: float | None = None
    same_top_se: float | None = None
    dp_mean: float | None = None
    dp_mean_se: float | None = None
    dp_rms: float | None = None
    dp_rms_se: float | None = None
    dp_max: float | None = None
    dp_min: float | None = None
    dp_median: float | None = None
    dp_pct: dict[float, float] | None = None

    @property
    def enough(self) -> bool:
        return self.positions >= MIN_POSITIONS

    def line(self) -> str:
        """The end-of-run line: `fidelity: kld_mean=<x> kld_p99=<x> same_top_pct=<x> positions=<n>` (p99 is
        `n/a` below MIN_POSITIONS, and the line says why)."""
        p99 = f"{self.kld_pct[99.0]:.6g}" if self.kld_pct else "n/a"
        tail = "" if self.enough else f" (no statistics below {MIN_POSITIONS} positions)"
        extra = f" kld_se={self.kld_se:.3g} dp_rms_pct={100 * self.dp_rms:.4g}" if self.enough else ""
        return (f"fidelity: kld_mean={self.kld_mean:.6g} kld_p99={p99} same_top_pct={100 * self.same_top:.4g} "
                f"positions={self.positions}{extra}{tail}")


def detail_lines(s: FidelityStats) -> list[str]:
    """perplexity.cpp's KL-divergence and token-probability blocks in three lines (none below MIN_POSITIONS)."""
    if not s.enough:
        return []
    assert s.kld_pct is not None and s.dp_pct is not None and s.dp_rms is not None
    pk = " ".join(f"p{q:g}={v:.6g}" for q, v in s.kld_pct.items())
    pd = " ".join(f"p{q:g}={100 * v:.4g}" for q, v in s.dp_pct.items())
    return [f"fidelity KLD: mean={s.kld_mean:.6g} ± {s.kld_se:.3g} max={s.kld_max:.6g} {pk} median={s.kld_median:.6g} "
            f"min={s.kld_min:.6g} (nats)",
            f"fidelity same top: {100 * s.same_top:.3f} ± {100 * s.same_top_se:.3f} %",
            f"fidelity Δp (%): mean={100 * s.dp_mean:.4g} ± {100 * s.dp_mean_se:.3g} rms={100 * s.dp_rms:.4g} ± "
            f"{100 * s.dp_rms_se:.3g} max={100 * s.dp_max:.4g} {pd} median={100 * s.dp_median:.4g} "
            f"min={100 * s.dp_min:.4g}"]


def summarize(a: Against) -> FidelityStats:
    """perplexity.cpp's KL-divergence and token-probability statistics over all positions."""
    n = len(a.kld)
    if n == 0:
        raise ValueError("no positions to summarise")
    kld = np.asarray(a.kld, dtype=np.float64)
    same = float(np.count_nonzero(a.same_top)) / n
    base = FidelityStats(positions=n, kld_mean=mean_and_uncertainty(kld)[0], kld_max=float(kld.max()),
                         same_top=same)
    if n < MIN_POSITIONS:
        return base
    # perplexity.cpp keeps the per-position values as float (the sums in double): so are its percentiles
    ks, ds = np.sort(kld.astype(np.float32)), np.sort(np.asarray(a.dp, dtype=np.float32))
    dp = np.asarray(a.dp, dtype=np.float64)
    dp_mean = mean_and_uncertainty(dp)
    mse, mse_se = mean_and_uncertainty(np.square(dp))
    rms = float(np.sqrt(mse))
    return FidelityStats(
        positions=n, kld_mean=base.kld_mean, kld_max=float(ks[-1]), same_top=same,
        kld_se=mean_and_uncertainty(kld)[1], kld_median=median(ks),
        kld_pct={q: percentile(ks, q / 100) for q in KLD_PERCENTILES}, kld_min=float(ks[0]),
        same_top_se=float(np.sqrt(same * (1 - same) / (n - 1))),
        dp_mean=dp_mean[0], dp_mean_se=dp_mean[1], dp_rms=rms, dp_rms_se=(0.5 / rms * mse_se if rms > 0 else 0.0),
        dp_max=float(ds[-1]), dp_min=float(ds[0]), dp_median=median(ds),
        dp_pct={q: percentile(ds, q / 100) for q in DP_PERCENTILES})


@dataclass(frozen=True)
class ChunkInterval:
    """The mean KLD with a t interval over chunks: each chunk's mean is one observation (positions in a chunk share
    its context, so they are not independent; chunks are separate windows of the text, each from an empty cache).
    The point is the mean over all positions (equal to the mean of the chunk means: every chunk scores as many)."""

    mean: float
    low: float
    high: float
    n_chunks: int
    confidence: float


def chunk_interval(kld: np.ndarray, chunk: np.ndarray, confidence: float = 0.95) -> ChunkInterval:
    """mean +- t(confidence, n-1) * sd(chunk means) / sqrt(n) over the n chunks, the low end clipped at 0 (a KLD
    is never negative); no interval (low = high = nan) below two chunks."""
    from scipy.special import stdtrit

    kld, chunk = np.asarray(kld, dtype=np.float64), np.asarray(chunk)
    ids = np.unique(chunk)
    means = np.array([kld[chunk == c].mean() for c in ids])
    mean = float(kld.mean()) if len(kld) else float("nan")
    if len(ids) < 2:
        return ChunkInterval(mean, float("nan"), float("nan"), len(ids), confidence)
    half = float(stdtrit(len(ids) - 1, 0.5 + confidence / 2)) * float(means.std(ddof=1)) / np.sqrt(len(ids))
    return ChunkInterval(mean, max(0.0, mean - half), mean + half, len(ids), confidence)
