"""Eq. 12 (B_ver) on one configuration's curve: the paper's rule, kept beside the decision
(bole_cli.calibrate.decision, which chooses with drafting counted; docs/design.md §8).

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
from typing import Optional, Sequence


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
