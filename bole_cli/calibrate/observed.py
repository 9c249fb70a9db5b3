"""Acceptance from observed accepted-length histograms (docs/design.md §8, "Observed histograms").

A serving engine reports, per verify step, how many draft tokens the target accepted
(SGLang logs the mean "accept len" = accepted drafts + 1 and can dump the per-step values).
That histogram, and the speculative settings it was observed under, is what a user has;
this module fits the per-depth, per-rank acceptance model q[d][r] of
bole_cli/calibrate/acceptance.py to it and says how well the model explains it.

File (YAML or JSON, read by `--acceptance FILE`):

    name: chat traffic, SGLang 0.5.23        # optional
    accepted_length_histogram:
      convention: accepted_drafts            # default; or accept_length (SGLang's, L + 1)
      counts: [812, 1204, 1630, ...]         # accepted_drafts: c_L for L = 0..D (D + 1 values)
    speculative: {num_steps: 5, topk: 4, num_draft_tokens: 16}   # D, k, n as SGLang's flags
    extrapolate_to: 8                        # optional: depth of the model (default max(D, 8))
    interval_level: 0.95                     # optional: level of the per-depth intervals

c_L is the number of verify steps that accepted exactly L draft tokens (the bonus token not
counted), L = 0..D. With `convention: accept_length` the list is a bincount of SGLang's
per-step accept length L + 1: counts[j] = steps of accept length j, j = 0..D + 1
(D + 2 values; counts[0] must be 0). At least MIN_STEPS steps are needed.

Chain (topk 1; num_draft_tokens, if given, must be num_steps + 1 as SGLang sets it): with
S(d) = steps accepting >= d drafts, the top-1 acceptance at depth d is exactly
a_d = S(d) / S(d - 1), with a Wilson interval on S(d - 1) trials. That model is saturated
(G = 0, no degrees of freedom); the fit report is that of the preset family
a_d = a * decay^(d-1) fitted by maximum likelihood, which extrapolates depths beyond D
(and depths the data never reached). The matrix has one rank: a chain says nothing about
lower ranks.

Tree (topk > 1): the tree is SGLang's, the beam tree of (D, k) (trees/generators.beam_tree)
pruned to the n - 1 best draft nodes (budget.select_budget), both grown on the model's own
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
from statistics import NormalDist
from typing import Any, Callable, Optional, Sequence

from bole_cli.calibrate.ranks import DEFAULT_RANK_FACTOR, DEPTH_DECAY, PAPER_DEPTH
from bole_cli.calibrate.ranks import rank_matrix as rank_rows
from bole_cli.errors import InputError, brief
from bole_cli.trees.generators import beam_tree_size as beam_size

MIN_STEPS = 50
CONVENTIONS = ("accepted_drafts", "accept_length")
MAX_NUM_STEPS = 32
MAX_TOPK = 16
MAX_COUNT = 10**15
MIN_EXPECTED = 5.0  # cells are merged until each expects this many steps
POOR_P = 1e-3
POOR_DIFF = 0.01
# the family's search box
A_RANGE = (1e-3, 0.999)
DECAY_RANGE = (0.5, 1.1)
RANK_FACTOR_RANGE = (0.01, 1.0)
A_D_MAX = 0.9999  # a * decay^(d-1) is clamped here (decay may exceed 1)


@dataclass(frozen=True)
class Observation:
    """A checked histogram: counts[L] = steps that accepted L drafts, L = 0..num_steps."""

    counts: tuple[int, ...]
    num_steps: int
    topk: int
    num_draft_tokens: int
    convention: str
    extrapolate_to: int
    level: float

    @property
    def steps(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class ObservedFit:
    """What acceptance.from_data turns into an AcceptanceModel."""

    q: list
    source: str
    measured: dict


# ---- parsing ----------------------------------------------------------------------------------
def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InputError(f"{where}: expected an integer in {lo}..{hi}, got {brief(value)}")
    return value


def parse_observation(data: Any, source: str) -> Observation:
    """Check a histogram file's fields; bad input is one InputError naming the field."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with accepted_length_histogram")
    hist = data.get("accepted_length_histogram")
    if not isinstance(hist, dict):
        raise InputError(f"{source}: accepted_length_histogram: expected a mapping with counts")
    spec = data.get("speculative")
    if not isinstance(spec, dict):
        raise InputError(f"{source}: speculative: expected a mapping with num_steps, topk and "
                         "num_draft_tokens (the settings the histogram was observed under)")
    w = f"{source}: speculative"
    d = _int(spec.get("num_steps"), f"{w}.num_steps", 1, MAX_NUM_STEPS)
    k = _int(spec.get("topk"), f"{w}.topk", 1, MAX_TOPK)
    cap = beam_size(d, k)
    if k == 1:
        n = spec.get("num_draft_tokens", d + 1)
        if n != d + 1 or isinstance(n, bool):
            raise InputError(f"{w}.num_draft_tokens: a chain (topk 1) verifies num_steps + 1 = "
                             f"{d + 1} tokens (SGLang sets it so), got {brief(n)}")
    else:
        n = _int(spec.get("num_draft_tokens"), f"{w}.num_draft_tokens", 2, 10**9)
        if n > cap:
            raise InputError(f"{w}.num_draft_tokens: {n} is more than the tree of num_steps {d} "
                             f"and topk {k} holds ({cap}, root included)")
    conv = hist.get("convention", CONVENTIONS[0])
    if conv not in CONVENTIONS:
        raise InputError(f"{source}: accepted_length_histogram.convention: expected one of "
                         f"{', '.join(CONVENTIONS)}, got {brief(conv)}")
    where = f"{source}: accepted_length_histogram.counts"
    raw = hist.get("counts")
    if not isinstance(raw, list):
        raise InputError(f"{where}: expected a list of non-negative integers")
    for i, c in enumerate(raw):
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= MAX_COUNT:
            raise InputError(f"{where}[{i}]: expected a non-negative integer (at most "
                             f"{MAX_COUNT:.0e}), got {brief(c)}")
    if conv == "accept_length":
        if len(raw) != d + 2:
            raise InputError(f"{where}: {len(raw)} values; accept lengths 0..num_steps + 1 need "
                             f"{d + 2} (convention accept_length)")
        if raw[0]:
            raise InputError(f"{where}[0]: {raw[0]} steps of accept length 0; every step "
                             "accepts at least 1 (convention accept_length)")
        counts = tuple(raw[1:])
    else:
        if len(raw) != d + 1:
            raise InputError(f"{where}: {len(raw)} values; accepted drafts 0..num_steps need "
                             f"{d + 1} (convention accepted_drafts)")
        counts = tuple(raw)
    off = 1 if conv == "accept_length" else 0
    for L in range(n, d + 1):  # a step cannot accept more drafts than the tree has
        if counts[L]:
            raise InputError(f"{where}[{L + off}]: {counts[L]} steps accepted {L} drafts, but "
                             f"num_draft_tokens {n} holds only {n - 1}")
    if sum(counts) < MIN_STEPS:
        raise InputError(f"{where}: {sum(counts)} verify steps; at least {MIN_STEPS} are needed "
                         "to fit")
    depth = data.get("extrapolate_to", max(d, PAPER_DEPTH))
    depth = _int(depth, f"{source}: extrapolate_to", d, 64)
    level = data.get("interval_level", 0.95)
    if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0 < level < 1:
        raise InputError(f"{source}: interval_level: expected a number in (0, 1), got "
                         f"{brief(level)}")
    return Observation(counts, d, k, n, conv, depth, float(level))


# ---- the model ----------------------------------------------------------------------------------
def family_rows(a: float, decay: float, rank_factor: float, depth: int,
                top_k: int) -> list[list[float]]:
    """q of the preset family: a_d = a * decay^(d-1) (clamped below 1), ranks by rank_factor."""
    return rank_rows([min(a * decay**i, A_D_MAX) for i in range(depth)], top_k, rank_factor)


def kept_depth_mass(q: Sequence[Sequence[float]], num_steps: int, topk: int,
                    num_draft_tokens: int) -> list[float]:
    """m_L, L = 0..num_steps: summed P(v) of the kept nodes at depth L (m_0 = 1, the root).

    The tree is beam_tree(num_steps, topk, level_probs=q) pruned by select_budget to
    num_draft_tokens nodes, computed here the same way (same log sums, same tie order) but
    without the 256-node cap, since SGLang's trees may be larger (tests check the match).
    """
    score, depth = [0.0], [0]
    frontier = [0]
    for lvl in range(num_steps):
        logs = [math.log(p) if p > 0 else -math.inf for p in q[lvl][:topk]]
        new = []
        for node in frontier:
            for lp in logs:
                score.append(score[node] + lp)
                depth.append(lvl + 1)
                new.append(len(score) - 1)
        frontier = sorted(new, key=lambda i: (-score[i], i))[:topk]
    order = sorted(range(1, len(score)), key=lambda i: (-score[i], i))[:num_draft_tokens - 1]
    mass = [0.0] * (num_steps + 1)
    mass[0] = 1.0
    for i in order:
        mass[depth[i]] += math.exp(score[i])
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


def log_likelihood(counts: Sequence[int], probs: Sequence[float]) -> float:
    total = 0.0
    for c, p in zip(counts, probs):
        if c:
            total += c * math.log(max(p, 1e-300))
    return total


# ---- statistics ---------------------------------------------------------------------------------
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


def wilson(hits: int, trials: int, level: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) without trials."""
    if trials <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = hits / trials
    den = 1 + z * z / trials
    mid = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def merge_cells(observed: Sequence[float], expected: Sequence[float],
                minimum: float = MIN_EXPECTED) -> tuple[list[float], list[float]]:
    """Adjacent cells pooled (in order of L) until each expects >= minimum; a short tail
    joins the last pooled cell."""
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


def goodness(counts: Sequence[int], probs: Sequence[float], n_params: int) -> dict:
    """G against the saturated model, df, p-value, the largest frequency gap and a verdict."""
    steps = sum(counts)
    obs, exp = merge_cells(counts, [steps * p for p in probs])
    g = 0.0
    for o, e in zip(obs, exp):
        if o > 0:
            g = math.inf if e <= 0 else g + 2 * o * math.log(o / e)
    g = max(g, 0.0)
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


# ---- maximum likelihood over the family -------------------------------------------------------
PARAMS = ("a", "decay", "rank_factor")
RANGES = {"a": A_RANGE, "decay": DECAY_RANGE, "rank_factor": RANK_FACTOR_RANGE}
GRIDS = {"a": [0.02 * i for i in range(1, 50)],
         "decay": [0.6, 0.75, 0.85, 0.9, 0.94, 0.97, 1.0, 1.03, 1.07],
         "rank_factor": [0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 1.0]}
DEFAULTS = {"a": 0.8, "decay": DEPTH_DECAY, "rank_factor": DEFAULT_RANK_FACTOR}
STARTS = 6  # best grid points refined
COMPASS_ROUNDS = 80  # moves or halvings per start


def free_parameters(num_steps: int, topk: int) -> list[str]:
    """What the histogram can pin down: D free frequencies, so at most D - 1 parameters
    (one degree of freedom left to test the fit; a depth-1 histogram fits a alone): a
    first, then the rank factor (trees only), then the decay."""
    order = ["a"] + (["rank_factor"] if topk > 1 else []) + ["decay"]
    return order[:max(1, num_steps - 1)]


def fit_family(obs: Observation, probs_of: Callable[[dict], list[float]],
               free: Sequence[str]) -> tuple[dict, float]:
    """Maximum likelihood over the free parameters (the others at DEFAULTS).

    The likelihood of a pruned tree is piecewise smooth with jumps (the kept nodes change
    as the parameters move), so a golden section (which assumes one smooth peak) stops in
    the wrong piece: the best STARTS points of a grid are refined by a compass search
    (a step up or down per parameter while it gains, halved when none does, to 1e-6).
    """
    def ll(theta: dict) -> float:
        return log_likelihood(obs.counts, probs_of(theta))

    grids = [GRIDS[p] if p in free else [DEFAULTS[p]] for p in PARAMS]
    scored = []
    for a in grids[0]:
        for decay in grids[1]:
            for rf in grids[2]:
                theta = {"a": a, "decay": decay, "rank_factor": rf}
                scored.append((ll(theta), theta))
    scored.sort(key=lambda t: -t[0])
    best, best_ll = dict(DEFAULTS), -math.inf
    for start_ll, start in scored[:STARTS]:
        theta, v = _compass(ll, start, start_ll, free)
        if v > best_ll:
            best, best_ll = theta, v
    return best, best_ll


def a_interval(obs: Observation, probs_of: Callable[[dict], list[float]], free: Sequence[str],
               best: dict, best_ll: float) -> tuple[float, float]:
    """Profile-likelihood interval for a at obs.level: the a whose best log-likelihood
    (the other free parameters refitted) is within z^2 / 2 of the maximum, found by
    bisection on each side (the first crossing from the maximum)."""
    z = NormalDist().inv_cdf(0.5 + obs.level / 2)
    target = best_ll - z * z / 2
    others = [p for p in free if p != "a"]

    def profile(a: float) -> float:
        theta = {**best, "a": a}
        value = log_likelihood(obs.counts, probs_of(theta))
        if others:
            value = _compass(lambda t: log_likelihood(obs.counts, probs_of(t)), theta, value,
                             others, rounds=30)[1]
        return value

    ends = []
    for bound in A_RANGE:
        inside, outside = best["a"], bound
        if profile(bound) >= target:
            ends.append(bound)
            continue
        for _ in range(14):
            mid = 0.5 * (inside + outside)
            inside, outside = (mid, outside) if profile(mid) >= target else (inside, mid)
        ends.append(0.5 * (inside + outside))
    return ends[0], ends[1]


def _compass(ll: Callable[[dict], float], theta: dict, value: float,
             free: Sequence[str], rounds: int = 0) -> tuple[dict, float]:
    step = {p: GRIDS[p][1] - GRIDS[p][0] if p == "a" else 0.05 for p in free}
    for _ in range(rounds or COMPASS_ROUNDS):
        if max(step.values()) <= 1e-6:
            break
        moved = False
        for p in free:
            lo, hi = RANGES[p]
            for x in (theta[p] + step[p], theta[p] - step[p]):
                x = min(max(x, lo), hi)
                v = ll({**theta, p: x})
                if v > value:
                    theta, value, moved = {**theta, p: x}, v, True
                    break
        if not moved:
            step = {p: s / 2 for p, s in step.items()}
    return theta, value


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
    for d in range(1, obs.num_steps + 1):
        trials, hits = survival[d - 1], survival[d]
        lo, hi = wilson(hits, trials, obs.level)
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
