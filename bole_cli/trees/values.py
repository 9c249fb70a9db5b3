"""Checks of the values a tree is built from (docs/design.md §4): lists, ids, log-probs.

Shared by the tree type, the SGLang-links reader, the file reader and the generators so
that each rejects a bad value with the same message.
"""

from __future__ import annotations

import math
from typing import Any

from bole_cli.errors import InputError, brief


def as_list(values: Any, what: str) -> list:
    """Accept lists, tuples, numpy arrays and torch tensors (via .tolist())."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise InputError(f"'{what}' must be a list, got {type(values).__name__}")
    return list(values)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_float(i: int, x: Any, what: str) -> float:
    if not is_number(x):
        raise InputError(f"node {i}: {what} {brief(x)} is not a number")
    try:
        x = float(x)
    except OverflowError:  # an int beyond float range
        raise InputError(f"node {i}: {what} {brief(x)} is out of range") from None
    if math.isnan(x):
        raise InputError(f"node {i}: {what} is NaN")
    return x


def check_log_prob(i: int, lp: Any) -> float:
    """Node i's draft log-probability as a float in (-inf, 0], or a clear error."""
    lp = _as_float(i, lp, "log-prob")
    if lp > 0.0:
        raise InputError(f"node {i}: log-prob {lp:g} is positive (a probability above 1)")
    if lp == -math.inf:
        raise InputError(f"node {i}: log-prob is -inf (probability 0)")
    return lp


def prob_to_log(i: int, p: Any) -> float:
    """Node i's draft probability in (0, 1], as its log, or a clear error."""
    p = _as_float(i, p, "probability")
    if not 0.0 < p <= 1.0:
        raise InputError(f"node {i}: probability {p:g} is outside (0, 1]")
    return math.log(p)
