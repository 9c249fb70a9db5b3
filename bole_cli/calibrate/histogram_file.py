"""A serving engine's accepted-length histogram file (docs/design.md §8, "Observed
histograms"): its format and its checks, so that bad input is one error naming the field
before any fitting.

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
(D + 2 values; counts[0] must be 0). At least MIN_STEPS steps are needed. A chain (topk 1)
verifies num_steps + 1 tokens (num_draft_tokens, if given, must say so, as SGLang sets it);
a tree's num_draft_tokens is at most its beam tree's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bole_cli.calibrate.ranks import PAPER_DEPTH
from bole_cli.errors import InputError, brief
from bole_cli.files import check_fields
from bole_cli.trees.generators import beam_tree_size

MIN_STEPS = 50
CONVENTIONS = ("accepted_drafts", "accept_length")
MAX_NUM_STEPS = 32
MAX_TOPK = 16
MAX_COUNT = 10**15


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
    check_fields(spec, ("num_steps", "topk", "num_draft_tokens"), w)
    check_fields(hist, ("counts", "convention"), f"{source}: accepted_length_histogram")
    d = _int(spec.get("num_steps"), f"{w}.num_steps", 1, MAX_NUM_STEPS)
    k = _int(spec.get("topk"), f"{w}.topk", 1, MAX_TOPK)
    cap = beam_tree_size(d, k)
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
