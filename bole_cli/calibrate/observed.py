"""Acceptance from observed accepted-length histograms (docs/design.md §8, "Observed histograms").

A serving engine reports, per verify step, how many draft tokens the target accepted
(SGLang logs the mean "accept len" = accepted drafts + 1 and can dump the per-step values).
That histogram, and the speculative settings it was observed under, is what a user has;
this module fits the per-depth, per-rank acceptance model q[d][r] of
bole_cli/calibrate/acceptance.py to it and says how well the model explains it.

The file's format and checks are calibrate/histogram_file.py's; the fit of the family,
calibrate/family_fit.py's; the statistics, bole_cli/stats.py's. This module holds the model
of the histogram and the report.

Chain (topk 1; num_draft_tokens, if given, must be num_steps + 1 as SGLang sets it): with
S(d) = steps accepting >= d drafts, the top-1 acceptance at depth d is exactly
a_d = S(d) / S(d - 1), with a Wilson interval on S(d - 1) trials. That model is saturated
(G = 0, no degrees of freedom); the fit report is that of the preset family
a_d = a * decay^(d-1) fitted by maximum likelihood, which extrapolates depths beyond D
(and depths the data never reached). The matrix has one rank: a chain says nothing about
lower ranks.

Tree (topk > 1): the tree is SGLang's, the beam tree of (D, k) (trees/generators.grow_beam,
as beam_tree grows it but with no node limit) pruned to the n - 1 best draft nodes
(budget.best_first, select_budget's order), grown on the model's own
P(v) = prod q[i][r_i]. Under the model the step stops at depth L with probability
m_L - m_{L+1}, m_L the summed P of the kept nodes at depth L (m_0 = 1): the mass of a node
less that of its kept children. The preset family (acceptance.rank_matrix: top-1 a at depth
1, a_d = a * decay^(d-1), rank factor) is fitted by maximum likelihood (a grid, then a
compass search from its best points; fit_family says why not golden sections), with a
profile-likelihood interval for a; parameters the histogram cannot pin down (beyond D - 1
of them) keep the presets' values, and the report says which.

Goodness of fit: the G statistic (log-likelihood ratio against the saturated multinomial)
over cells merged until each expects >= 5 steps, its degrees of freedom (cells - 1 -
fitted parameters) and chi-square p-value, and the largest absolute difference between
observed and fitted frequencies. The verdict is "poor fit" when the misfit is both
significant (p < POOR_P) and visible (a frequency off by more than POOR_DIFF); with
thousands of steps a G test rejects differences too small to matter.

The result (ObservedFit: q, source, measured) becomes an AcceptanceModel in
acceptance.from_data; `measured` carries the fit report into profiles. This module does not
import acceptance.py (that one imports this lazily; the import graph stays acyclic): the
family's rule and constants come from bole_cli.calibrate.ranks, which both read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from bole_cli.budget import best_first
from bole_cli.calibrate.family_fit import PARAMS, a_interval, fit_family, free_parameters
from bole_cli.calibrate.histogram_file import Observation, parse_observation
from bole_cli.calibrate.ranks import rank_matrix as rank_rows
from bole_cli.stats import chi2_sf, g_statistic, merge_cells, wilson, z_for_level
from bole_cli.trees.generators import grow_beam

POOR_P = 1e-3
POOR_DIFF = 0.01
A_D_MAX = 0.9999  # a * decay^(d-1) is clamped here (decay may exceed 1)


@dataclass(frozen=True)
class ObservedFit:
    """What acceptance.from_data turns into an AcceptanceModel."""

    q: list
    source: str
    measured: dict


# ---- the model ----------------------------------------------------------------------------------
def family_rows(a: float, decay: float, rank_factor: float, depth: int,
                top_k: int) -> list[list[float]]:
    """q of the preset family: a_d = a * decay^(d-1) (clamped below 1), ranks by rank_factor."""
    return rank_rows([min(a * decay**i, A_D_MAX) for i in range(depth)], top_k, rank_factor)


def kept_depth_mass(q: Sequence[Sequence[float]], num_steps: int, topk: int,
                    num_draft_tokens: int) -> list[float]:
    """m_L, L = 0..num_steps: summed P(v) of the kept nodes at depth L (m_0 = 1, the root).

    The tree is SGLang's: the beam tree of (num_steps, topk) on q, with no node limit
    (SGLang's trees may exceed MAX_TREE_NODES), pruned to num_draft_tokens nodes in the
    order a budget keeps them.
    """
    logs = [[math.log(p) if p > 0 else -math.inf for p in row[:topk]] for row in q[:num_steps]]
    parents, _, log_rho = grow_beam(num_steps, topk, logs.__getitem__)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    mass = [0.0] * (num_steps + 1)
    mass[0] = 1.0
    for i in best_first(log_rho)[1:num_draft_tokens]:  # the root (rho 1) comes first
        mass[depth[i]] += math.exp(log_rho[i])
    return mass


def stop_probs(mass: Sequence[float]) -> list[float]:
    """P(the step accepts exactly L drafts) = m_L - m_{L+1}."""
    out = [max(mass[L] - (mass[L + 1] if L + 1 < len(mass) else 0.0), 0.0)
           for L in range(len(mass))]
    total = sum(out)
    return [p / total for p in out] if total > 0 else out


def chain_mass(per_depth: Sequence[float], num_steps: int) -> list[float]:
    mass, m = [1.0], 1.0
    for a in per_depth[:num_steps]:
        m *= a
        mass.append(m)
    return mass


# ---- goodness of fit ----------------------------------------------------------------------------
def goodness(counts: Sequence[int], probs: Sequence[float], n_params: int) -> dict:
    """G against the saturated model, df, p-value, the largest frequency gap and a verdict."""
    steps = sum(counts)
    obs, exp = merge_cells(counts, [steps * p for p in probs])
    g = g_statistic(obs, exp)
    df = len(obs) - 1 - n_params
    p_value = chi2_sf(g, df) if df > 0 else None
    gaps = [abs(c / steps - p) for c, p in zip(counts, probs)]
    worst = max(range(len(gaps)), key=lambda L: (gaps[L], -L))
    report = {"g": _round(g), "df": df,
              "p_value": None if p_value is None else float(f"{p_value:.4g}"),
              "cells": len(obs), "parameters": n_params, "max_abs_diff": round(gaps[worst], 5),
              "max_abs_diff_at": worst}
    what = (f"it expects {100 * probs[worst]:.1f}% of steps to accept {worst} drafts, the data "
            f"show {100 * counts[worst] / steps:.1f}%")
    report["quality"] = ("untested" if p_value is None else
                         "poor fit" if p_value < POOR_P and gaps[worst] > POOR_DIFF else "good fit")
    if p_value is None:
        report["verdict"] = (f"untested: no degrees of freedom left ({len(obs)} cell"
                             f"{'s' if len(obs) != 1 else ''} after merging, {n_params} "
                             "parameters)")
    elif p_value < POOR_P and gaps[worst] > POOR_DIFF:
        report["verdict"] = (f"poor fit: the model does not explain the histogram (G {g:.1f}, "
                             f"df {df}, p {p_value:.2g}): {what}")
    elif p_value < POOR_P:
        report["verdict"] = (f"good fit: the misfit is significant over {steps} steps "
                             f"(p {p_value:.2g}) but no frequency is off by more than "
                             f"{POOR_DIFF:g}")
    else:
        report["verdict"] = f"good fit (G {g:.1f}, df {df}, p {p_value:.2g})"
    return report


def _round(x: float) -> float:
    return x if math.isinf(x) else round(x, 4)


# ---- the two fits -------------------------------------------------------------------------------
def _tree_probs(obs: Observation) -> Callable[[dict], list[float]]:
    def probs(theta: dict) -> list[float]:
        q = family_rows(theta["a"], theta["decay"], theta["rank_factor"], obs.num_steps, obs.topk)
        return stop_probs(kept_depth_mass(q, obs.num_steps, obs.topk, obs.num_draft_tokens))
    return probs


def _chain_probs(obs: Observation) -> Callable[[dict], list[float]]:
    def probs(theta: dict) -> list[float]:
        a = [min(theta["a"] * theta["decay"]**i, A_D_MAX) for i in range(obs.num_steps)]
        return stop_probs(chain_mass(a, obs.num_steps))
    return probs


def fit_observation(obs: Observation) -> tuple[list[list[float]], dict]:
    """q (obs.extrapolate_to depths) and the fit report that `measured` carries."""
    chain = obs.topk == 1
    free = free_parameters(obs.num_steps, obs.topk)
    probs_of = _chain_probs(obs) if chain else _tree_probs(obs)
    theta, ll = fit_family(obs, probs_of, free)
    fitted = probs_of(theta)
    family = {p: round(theta[p], 5) for p in PARAMS if not (chain and p == "rank_factor")}
    lo, hi = a_interval(obs, probs_of, free, theta, ll)
    report: dict[str, Any] = {
        "family": family,
        "a_interval": {"lower": round(lo, 5), "upper": round(hi, 5), "level": obs.level,
                       "method": "profile likelihood"},
        "fitted_parameters": list(free),
        "fixed_parameters": [p for p in PARAMS if p not in free and p in family],
        "log_likelihood": round(ll, 4),
        **goodness(obs.counts, fitted, len(free)),
        "observed_freq": [round(c / obs.steps, 5) for c in obs.counts],
        "fitted_freq": [round(p, 5) for p in fitted],
    }
    fam_rows = family_rows(theta["a"], theta["decay"], theta["rank_factor"],
                           obs.extrapolate_to, obs.topk)
    extrapolated = list(range(obs.num_steps + 1, obs.extrapolate_to + 1))
    if not chain:
        return fam_rows, {"fit": report, "extrapolated_depths": extrapolated}
    # chain: exact a_d where the data reached depth d - 1, the family elsewhere
    survival = [sum(obs.counts[d:]) for d in range(obs.num_steps + 1)]
    per_depth, lower, upper, unseen = [], [], [], []
    z = z_for_level(obs.level)
    for d in range(1, obs.num_steps + 1):
        trials, hits = survival[d - 1], survival[d]
        lo, hi = wilson(hits, trials, z)
        if trials:
            per_depth.append(round(hits / trials, 6))
        else:
            per_depth.append(round(fam_rows[d - 1][0], 6))
            unseen.append(d)
        lower.append(round(lo, 6))
        upper.append(round(hi, 6))
    q = [[a] for a in per_depth] + [[row[0]] for row in fam_rows[obs.num_steps:]]
    report["verdict"] = ("exact at the observed depths (a chain's histogram fixes every a_d); "
                         f"the family that extrapolates: {report['verdict']}")
    return q, {"fit": report, "extrapolated_depths": unseen + extrapolated,
               "per_depth": {"a": per_depth, "lower": lower, "upper": upper,
                             "level": obs.level, "method": "wilson",
                             "trials": survival[:-1], "hits": survival[1:]}}


def fit_observed(data: Any, source: str) -> ObservedFit:
    """A histogram file (module docstring) -> q, a source line and the `measured` summary."""
    obs = parse_observation(data, source)
    q, details = fit_observation(obs)
    chain = obs.topk == 1
    shape = (f"chain of {obs.num_steps}" if chain else
             f"tree of depth {obs.num_steps}, top-k {obs.topk}, {obs.num_draft_tokens} tokens")
    extra = details["extrapolated_depths"]
    note = (f"; depths {_spans(extra)} extrapolated by the family" if extra else "")
    what = f"{obs.steps} observed verify steps, {shape}"
    summary: dict[str, Any] = {
        "what": what,
        "method": ("per-depth acceptance S(d)/S(d-1) from the accepted-length histogram" if chain
                   else "maximum likelihood fit of the preset family to the accepted-length "
                        "histogram"),
        "steps": obs.steps,
        "speculative": {"num_steps": obs.num_steps, "topk": obs.topk,
                        "num_draft_tokens": obs.num_draft_tokens},
        "convention": obs.convention,
        "counts": list(obs.counts),
        **details,
        "verdict": details["fit"]["verdict"],
    }
    if isinstance(data.get("name"), str):
        summary["observed_name"] = data["name"]
    quality = details["fit"]["quality"]
    source_line = (f"file {source} (observed: {what}{note}; "
                   + (f"exact per depth, family {quality})" if chain else f"{quality})"))
    return ObservedFit(q=q, source=source_line, measured=summary)


def _spans(depths: Sequence[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    out: list[str] = []
    start: Optional[int] = None
    for i, d in enumerate(depths):
        if start is None:
            start = d
        if i + 1 == len(depths) or depths[i + 1] != d + 1:
            out.append(str(start) if start == d else f"{start}-{d}")
            start = None
    return ", ".join(out)
