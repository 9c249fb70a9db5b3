"""The preset family (a, decay, rank factor) fitted to a histogram by maximum likelihood
(docs/design.md §8, "Observed histograms"): which parameters a histogram can pin down, the
fit (a grid, then a compass search from its best points) and a profile-likelihood interval
for a. The histogram's probabilities under a parameter set come from the caller
(calibrate/observed.py), so this module knows nothing of trees or chains.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from bole_cli.calibrate.histogram_file import Observation
from bole_cli.calibrate.ranks import DEFAULT_RANK_FACTOR, DEPTH_DECAY
from bole_cli.stats import z_for_level

# the family's search box
A_RANGE = (1e-3, 0.999)
DECAY_RANGE = (0.5, 1.1)
RANK_FACTOR_RANGE = (0.01, 1.0)


def log_likelihood(counts: Sequence[int], probs: Sequence[float]) -> float:
    """The multinomial log-likelihood, less its constant; a zero probability is floored so
    that the search can still rank parameter sets that give an observed length none."""
    total = 0.0
    for c, p in zip(counts, probs):
        if c:
            total += c * math.log(max(p, 1e-300))
    return total


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
    z = z_for_level(obs.level)
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
