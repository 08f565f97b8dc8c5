"""Statistics of the studies: mean and sample standard deviation over seeds, and the verdict on a paired
difference from its 95% Student-t interval."""
import functools
import math
import statistics


@functools.lru_cache(maxsize=None)
def t95(df):
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf(0.975, df)``:
    12.706 at 1, 4.303 at 2, 2.228 at 10, 1.96 in the limit).

    Raises:
        ValueError: ``df`` is not a positive integer.
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df!r}")
    from scipy.stats import t  # a second's import, paid only where an interval is computed
    return float(t.ppf(0.975, df))


def mean_sd(values):
    """``(mean, sample standard deviation, n)`` of the non-None values (sd None when n < 2)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def verdict(diffs, claimed_sign):
    """Verdict on a paired difference.

    Args:
        diffs: one difference per seed (None entries are dropped).
        claimed_sign: +1 if the claim says the difference is positive, -1 if negative.

    Returns:
        dict with ``mean``, ``sd``, ``n``, ``ci`` (half-width of the 95% t-interval) and ``verdict``:
        ``holds`` (the interval lies wholly on the claimed side of zero) / ``does not hold`` (wholly on the
        other side) / ``inconclusive`` (it spans zero, or fewer than 2 differences).
    """
    mean, sd, n = mean_sd(diffs)
    if n < 2 or sd is None:
        return dict(mean=mean, sd=sd, n=n, ci=None, verdict="inconclusive")
    half = t95(n - 1) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if claimed_sign * lo > 0 and claimed_sign * hi > 0:
        word = "holds"
    elif claimed_sign * lo < 0 and claimed_sign * hi < 0:
        word = "does not hold"
    else:
        word = "inconclusive"
    return dict(mean=mean, sd=sd, n=n, ci=half, verdict=word)


def ms_text(values, digits=2):
    """``mean ± sd`` of the values with ``digits`` decimals (the mean alone for one value, ``-`` for none); a
    non-zero mean that would print as zero with two significant digits instead (``3.6e-06 ± 1.2e-06``: a vanishing
    gradient ratio is not 0.00)."""
    m, sd, _ = mean_sd(values)
    if m is None:
        return "-"
    if m != 0 and abs(m) < 0.5 * 10 ** -digits:
        return f"{m:.1e} ± {sd:.1e}" if sd is not None else f"{m:.1e}"
    return f"{m:.{digits}f} ± {sd:.{digits}f}" if sd is not None else f"{m:.{digits}f}"
