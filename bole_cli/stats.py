"""The statistics calibrate/ and mtp/ share: the Wilson interval, the chi-square tail and
the pooling of sparse cells for a G test. Standard library only (no scipy, no torch), so
reading an acceptance file stays instant.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

Z95 = 1.959963984540054  # the two-sided 95% normal quantile
MIN_EXPECTED = 5.0  # merge_cells pools cells until each expects this many counts


def z_for_level(level: float) -> float:
    """The two-sided normal quantile of a confidence level (0.95 -> 1.96)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(hits: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) without trials.

    z is the normal quantile (z_for_level(level) for a level)."""
    if trials <= 0:
        return 0.0, 1.0
    p = hits / trials
    den = 1 + z * z / trials
    mid = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution: the regularized gamma Q(df/2, x/2)
    (series below s + 1, Lentz's continued fraction above)."""
    if df <= 0:
        raise ValueError("df must be positive")
    if x <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    s, z = df / 2.0, x / 2.0
    log_pre = s * math.log(z) - z - math.lgamma(s)
    if z < s + 1:
        term = total = 1.0 / s
        a = s
        for _ in range(10000):
            a += 1
            term *= z / a
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, min(1.0, 1.0 - math.exp(log_pre) * total))
    tiny = 1e-300
    b = z + 1 - s
    c, dd = 1 / tiny, 1 / b
    h = dd
    for i in range(1, 10000):
        an = -i * (i - s)
        b += 2
        dd = an * dd + b
        dd = tiny if abs(dd) < tiny else dd
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        dd = 1 / dd
        delta = dd * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return max(0.0, min(1.0, math.exp(log_pre) * h))


def merge_cells(observed: Sequence[float], expected: Sequence[float],
                minimum: float = MIN_EXPECTED) -> tuple[list[float], list[float]]:
    """Adjacent cells pooled (in order) until each expects >= minimum, so that G follows
    its chi-square law; a short tail joins the last pooled cell."""
    obs, exp = [], []
    o_acc = e_acc = 0.0
    for o, e in zip(observed, expected):
        o_acc, e_acc = o_acc + o, e_acc + e
        if e_acc >= minimum:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc = e_acc = 0.0
    if o_acc or e_acc:
        if obs:
            obs[-1] += o_acc
            exp[-1] += e_acc
        else:
            obs.append(o_acc)
            exp.append(e_acc)
    return obs, exp


def g_statistic(observed: Sequence[float], expected: Sequence[float]) -> float:
    """The log-likelihood ratio G = 2 sum o ln(o / e) (inf where a cell seen expects none)."""
    g = 0.0
    for o, e in zip(observed, expected):
        if o > 0:
            g = math.inf if e <= 0 else g + 2 * o * math.log(o / e)
    return max(g, 0.0)
