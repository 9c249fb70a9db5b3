"""bole_cli.stats: the Wilson interval, the chi-square tail and the pooling of cells for the
G test, shared by the observed-histogram fit (calibrate/) and `bole acceptance` (mtp/)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bole_cli.stats import Z95, chi2_sf, g_statistic, merge_cells, wilson, z_for_level


@given(st.floats(1e-6, 400.0), st.integers(1, 40))
def test_chi2_sf_against_closed_forms(x, df):
    if df == 1:
        want = math.erfc(math.sqrt(x / 2))
    elif df % 2 == 0:  # Q(m, z) = e^-z sum_{i<m} z^i / i!
        z = x / 2
        want = math.exp(-z) * math.fsum(z**i / math.factorial(i) for i in range(df // 2))
    else:  # Q(m + 1/2, z) = erfc(sqrt z) + e^-z sum_{i<m} z^(i+1/2) / Gamma(i + 3/2)
        z = x / 2
        want = math.erfc(math.sqrt(z)) + math.exp(-z) * math.fsum(
            z**(i + 0.5) / math.gamma(i + 1.5) for i in range(df // 2))
    got = chi2_sf(x, df)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_chi2_sf_known_quantiles():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(11.070497693516351, 5) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(0.0, 3) == 1.0 and chi2_sf(math.inf, 3) == 0.0


@given(st.integers(0, 500), st.integers(0, 500))
def test_wilson_matches_the_measured_files(hits, extra):
    """The observed fit's intervals at level 0.95 are the measured files' (z = Z95)."""
    assert wilson(hits, hits + extra, z_for_level(0.95)) == pytest.approx(
        wilson(hits, hits + extra))


def test_z_for_level_is_the_normal_quantile():
    assert z_for_level(0.95) == pytest.approx(Z95, rel=1e-12)
    assert z_for_level(0.9) == pytest.approx(1.6448536269514722, rel=1e-12)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=12), st.data())
def test_merged_cells_keep_totals_and_expect_five(counts, data):
    weights = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(counts),
                                 max_size=len(counts)))
    total = sum(counts) or 1
    w = sum(weights) or 1.0
    expected = [total * x / w for x in weights]
    o, e = merge_cells(counts, expected)
    assert sum(o) == sum(counts) and sum(e) == pytest.approx(sum(expected))
    if sum(expected) >= 5:
        assert min(e) >= 5 - 1e-9


def test_g_statistic_is_zero_on_a_perfect_fit_and_infinite_on_an_impossible_cell():
    assert g_statistic([10, 20, 30], [10.0, 20.0, 30.0]) == 0.0
    assert g_statistic([10, 0], [5.0, 5.0]) == pytest.approx(2 * 10 * math.log(2))
    assert g_statistic([10, 1], [11.0, 0.0]) == math.inf
