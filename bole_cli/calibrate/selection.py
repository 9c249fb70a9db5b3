"""Budget selection on one configuration's curve: Eq. 12 (B_ver) and the
throughput-optimal budget N* (Sequoia's rule with verify times).

Eq. 12:  B_ver(c) = max { N in grid : T_ver(N|c) <= (1 + eps) T_dec(c) }.

Verify time cannot fall when the tree grows, so the rule is applied to the running
maximum of the measured curve: a noisy dip after the curve has crossed the threshold
cannot raise B_ver, and B_ver is the last grid point before the first crossing. Every
returned B_ver therefore satisfies the literal Eq. 12 inequality on the measured value.
When even the smallest grid point is above the threshold, B_ver is that point and the
result says so (`below_threshold`), so the caller can warn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class Budget:
    b_ver: int
    below_threshold: bool  # no grid point met the threshold; b_ver is the smallest point


def envelope(values: Sequence[float]) -> list[float]:
    """Running maximum: the non-decreasing curve a verify time must follow."""
    out, top = [], float("-inf")
    for v in values:
        top = max(top, v)
        out.append(top)
    return out


def select_b_ver(n: Sequence[int], t_ver: Sequence[float], t_dec: float, eps: float) -> Budget:
    if not n or len(n) != len(t_ver):
        raise ValueError("select_b_ver needs one verify time per grid point")
    if eps <= 0:
        raise ValueError("eps must be > 0")
    limit = (1.0 + eps) * t_dec
    best: Optional[int] = None
    for point, t in zip(n, envelope(t_ver)):
        if t > limit:
            break
        best = point
    if best is None:
        return Budget(b_ver=int(n[0]), below_threshold=True)
    return Budget(b_ver=int(best), below_threshold=False)


def throughput_optimal(n: Sequence[int], t_ver: Sequence[float],
                       accepted: Callable[[int], Optional[float]]) -> tuple[Optional[int], list[Optional[float]]]:
    """N* = argmax E[accepted | N] / T_ver(N) over the grid (on the running-max curve).

    `accepted(N)` gives the batch's expected committed tokens for N tree tokens (None
    where N is infeasible). Returns N* (None if no point is feasible) and the expected
    tokens per grid point. Ties go to the smaller N.
    """
    best, best_rate = None, float("-inf")
    e_acc: list[Optional[float]] = []
    for point, t in zip(n, envelope(t_ver)):
        e = accepted(int(point))
        e_acc.append(e)
        if e is not None and e / t > best_rate * (1 + 1e-12):
            best, best_rate = int(point), e / t
    return best, e_acc
