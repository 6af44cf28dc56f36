"""Two-sample tests for the study's seed comparisons, in plain Python (no scipy dependency).

Both are one-sided and ask whether sample `a` is lower than sample `b` (perplexity: lower is
better):
- `welch_t`: Welch's t-test (unequal variances, Welch-Satterthwaite degrees of freedom), the
  p-value from Student's t distribution;
- `mann_whitney_exact`: the exact permutation distribution of the Mann-Whitney U statistic (ties
  count one half), fine for the study's handful of seeds. With three seeds against three, its
  smallest possible p is 1/20 = 0.05.
"""

from __future__ import annotations

import itertools
import math


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) for 0 <= x <= 1, a, b > 0."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x!r}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_sf(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return tail if t >= 0 else 1.0 - tail


def welch_t(a, b) -> tuple[float, float, float]:
    """(t, df, p): Welch's test that mean(a) < mean(b); t = (mean(b) - mean(a)) / se, p = P(T >= t).
    Needs two values on each side; equal samples with no spread give (nan, nan, nan)."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs >= 2 values per sample, got {len(a)} and {len(b)}")
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / len(a)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / len(b)
    if var_a + var_b == 0:
        return math.nan, math.nan, math.nan
    t = (mean_b - mean_a) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a ** 2 / (len(a) - 1) + var_b ** 2 / (len(b) - 1))
    return t, df, student_t_sf(t, df)


def _u_lower(a, b) -> float:
    """Pairs (x in a, y in b) with x < y, ties counting one half."""
    return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in a for y in b)


def mann_whitney_exact(a, b) -> tuple[float, float]:
    """(U, p): U counts the pairs in which a's value is lower; p is the share of the equally likely
    relabellings of the pooled values (a's size kept) whose U is at least as large."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if not a or not b:
        raise ValueError("both samples need at least one value")
    pooled, observed = a + b, _u_lower(a, b)
    count = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        u = _u_lower([pooled[i] for i in chosen], [pooled[i] for i in range(len(pooled)) if i not in picked])
        count += u >= observed - 1e-12
        total += 1
    return observed, count / total
