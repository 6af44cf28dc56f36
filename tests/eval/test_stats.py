"""tapa.eval.stats against closed forms and hand-countable cases."""

from __future__ import annotations

import math

import pytest

from tapa.eval import stats


@pytest.mark.parametrize("t", [-3.0, -0.4, 0.0, 0.7, 2.5, 40.0])
def test_student_t_tail_matches_its_closed_forms(t):
    # df = 1 is the Cauchy distribution; df = 2 has P(T >= t) = 1/2 - t / (2 sqrt(2 + t^2))
    assert math.isclose(stats.student_t_sf(t, 1), 0.5 - math.atan(t) / math.pi, rel_tol=1e-10, abs_tol=1e-14)
    assert math.isclose(stats.student_t_sf(t, 2), 0.5 - t / (2 * math.sqrt(2 + t * t)), rel_tol=1e-10,
                        abs_tol=1e-14)


def test_student_t_tail_approaches_the_normal():
    normal = 0.5 * math.erfc(1.5 / math.sqrt(2))
    assert abs(stats.student_t_sf(1.5, 1e6) - normal) < 1e-6
    assert stats.student_t_sf(1.5, 3) > stats.student_t_sf(1.5, 30) > normal  # heavier tails


def test_welch_on_hand_computed_samples():
    t, df, p = stats.welch_t([1, 2, 3], [4, 6, 8])
    # variances of the means 1/3 and 4/3: t = 4 / sqrt(5/3); df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2)
    assert math.isclose(t, 4 / math.sqrt(5 / 3))
    assert math.isclose(df, (5 / 3) ** 2 / ((1 / 9) / 2 + (16 / 9) / 2))
    assert math.isclose(p, stats.student_t_sf(t, df))
    assert stats.welch_t([4, 6, 8], [1, 2, 3])[2] == pytest.approx(1 - p)  # the other direction
    assert all(v != v for v in stats.welch_t([2, 2], [2, 2]))  # no spread: undefined
    with pytest.raises(ValueError, match="2 values"):
        stats.welch_t([1], [2, 3])


def test_mann_whitney_exact_counts_relabellings():
    assert stats.mann_whitney_exact([1, 2, 3], [4, 5, 6]) == (9.0, 1 / 20)  # 1 of C(6, 3) = 20
    assert stats.mann_whitney_exact([4, 5, 6], [1, 2, 3]) == (0.0, 1.0)
    # one crossing: U = 8 of 9; relabellings with U >= 8: the two with at most one crossing
    assert stats.mann_whitney_exact([1, 2, 5], [3, 6, 7]) == (8.0, 2 / 20)
    u, p = stats.mann_whitney_exact([1, 1], [1, 1])  # all tied: every relabelling has U = 2
    assert (u, p) == (2.0, 1.0)


def test_regularized_beta_edges_and_symmetry():
    assert stats.regularized_beta(0.0, 2, 3) == 0.0 and stats.regularized_beta(1.0, 2, 3) == 1.0
    x, a, b = 0.3, 2.5, 4.0
    assert math.isclose(stats.regularized_beta(x, a, b), 1 - stats.regularized_beta(1 - x, b, a))
    assert math.isclose(stats.regularized_beta(0.4, 1, 1), 0.4)  # uniform
    with pytest.raises(ValueError):
        stats.regularized_beta(1.5, 1, 1)
