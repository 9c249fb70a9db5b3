"""Acceptance models: expected committed tokens per verify step for a tree of n tokens.

Model (Sequoia's positional acceptance, per depth). A drafter proposes, below every tree
node, its top-K candidates. Let q[d][r] be the probability that the rank-r candidate at
depth d (d = 1..D, r = 1..K) is the target's token, given that its parent was accepted.
The target token is one token, so the K events at one node exclude each other
(sum_r q[d][r] <= 1), and a draft node v = (r_1, ..., r_j) is accepted with probability
P(v) = prod_i q[i][r_i]. At most one node per depth is accepted, so

    E[accepted draft tokens | tree] = sum_{v in tree} P(v)

exactly. The tree is the one the drafter grows: the EAGLE beam tree of depth D and top-k K
(bole_cli.trees.beam_tree: level 1 the root's K candidates, each further level the K
candidates of each of the previous level's K best nodes), which SGLang's EAGLE worker and
`bole bench e2e`'s drafter both grow. A budget of n tokens (the root, i.e. the last
verified token, plus n - 1 draft nodes) keeps the n - 1 beam nodes of highest P, which is
prefix-connected (P never grows from a parent to a child): the rule of docs/design.md §4.
Counting the bonus (correction) token that every verify step commits,

    E1(n) = 1 + sum of the n - 1 largest P(v) of the beam tree  (committed tokens per request)

is increasing and concave in n, E1(1) = 1 is plain decoding, and it stops growing once the
whole beam tree (1 + K + (D - 1) K^2 tokens) is kept. For a batch of b identical requests
sharing a budget of N tokens, the global best-N rule gives every request its root and hands
the N - b draft slots out in score order, so E_b(N) = b + sum_{j < N-b} P_(floor(j / b)).
A chain of depth d is the beam tree of top-k 1: E1 = 1 + sum_{j<=d} prod_{i<=j} q[i][1].
`tree(...)` evaluates any (depth, top-k, budget, batch); `bole calibrate` weighs it, and
its drafting cost, against the verify time (docs/design.md §8).

Per-depth statistics. The built-in presets (and a file's `per_depth` list) give, per depth,
the top-1 acceptance a_d; lower ranks follow a fixed rule: the rank-r candidate is right,
given that ranks < r were wrong, with probability a_d * rank_factor^(r-1)
(rank_factor = 0.5 by default). A file may instead give the full `per_depth_rank` matrix
q[d][r], or a measured `curve` of E1 against n.

Measured files (`bole acceptance`, bole_cli/mtp/): the same `per_depth_rank` matrix, plus
`top_k` and a `measurement` block that says where it came from and how sure it is:

    name: qwen3.5-9b on chat.jsonl
    bole_acceptance: 1
    top_k: 4
    per_depth_rank: [[0.81, 0.06, 0.02, 0.01], ...]   # q[d][r] = counts[d][r] / trials[d]
    measurement:
      method: teacher-forced MTP drafts along the target's greedy continuation
      checkpoint: /models/Qwen3.5-9B       model_type: qwen3_5
      prompts: {file: chat.jsonl, sha256: ..., count: 200, used: 200}
      max_new: 256   depth: 8   device: NVIDIA H200   dtype: bfloat16
      versions: {bole: ..., torch: ..., transformers: ...}   date: ...   command: ...
      partial: false                       # true when Ctrl-C stopped it early
      anchors: 50600                       # positions measured
      trials: [50600, 43200, ...]          # per depth: anchors whose earlier depths hit
      counts: [[41000, 3000, ...], ...]    # per depth and rank: hits
      interval: {level: 0.95, method: wilson, lower: [[...]], upper: [[...]]}
      chain: {trials: [...], hits: [...], committed: 4.1}   # the greedy chain, measured
    expected: {chain: 4.0, trees: {"16": 5.2, ...}}        # from the matrix (informative)

Observed files (what a serving engine reports: the accepted length per verify step):
`accepted_length_histogram: {counts: [...]}` with the `speculative:` settings they ran
under; bole_cli.calibrate.observed fits the preset family to them and says how well
(docs/design.md §8).

Any reader of per_depth_rank reads it (`bole calibrate --acceptance`, `bole bench e2e
--acceptance`; `bole serve` through the calibrated profile, which keeps the matrix and a
summary of the measurement). from_data checks the measurement against the matrix.

Presets: a_d = a * 0.97^(d-1) with a fitted so that the beam tree of depth 8, top-k 4 at
a budget of 128 tokens commits the paper's mean accepted length (the Bole paper: MBPP 6.70,
GSM8K 7.08, ShareGPT 5.51, CNN/DailyMail 4.98; read as tokens committed per step, bonus
included, the usual convention for "mean accepted tokens"). One meaning everywhere:
`bole calibrate`, `bole serve` and `bole bench e2e` read the same q for a preset name.
"""

from __future__ import annotations

import functools
import math
import os
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from bole_cli.calibrate.ranks import (DEFAULT_RANK_FACTOR, DEFAULT_TOP_K, DEPTH_DECAY,  # noqa: F401
                                     PAPER_BUDGET, PAPER_DEPTH, rank_matrix)
from bole_cli.errors import InputError, brief
from bole_cli.files import check_fields
from bole_cli.limits import MAX_TREE_DRAFTS, MAX_TREE_NODES

# preset -> the paper's mean accepted tokens (depth 8, top-k 4, budget 128), and the depth-1
# top-1 acceptance fitted to it (tests/test_calibrate.py refits it and checks the constants).
PRESET_TARGETS = {
    "paper-mbpp": 6.70,
    "paper-gsm8k": 7.08,
    "paper-sharegpt": 5.51,
    "paper-cnndm": 4.98,
}
_PRESET_A1 = {
    "paper-mbpp": 0.9320,
    "paper-gsm8k": 0.9564,
    "paper-sharegpt": 0.8450,
    "paper-cnndm": 0.7995,
}
DEFAULT_PRESET = "paper-mbpp"


def preset_rows(top1: float, depth: int = PAPER_DEPTH, top_k: int = DEFAULT_TOP_K) -> list[list[float]]:
    """q[d][r] of a preset-shaped model: top-1 acceptance `top1` at depth 1, decaying by
    DEPTH_DECAY per level, lower ranks by DEFAULT_RANK_FACTOR."""
    return rank_matrix([top1 * DEPTH_DECAY**d for d in range(depth)], top_k, DEFAULT_RANK_FACTOR)


#: A rank a file lacks, or a measured 0, in a beam tree (a log-probability needs p > 0).
TINY = 1e-12


def beam_rows(q: Sequence[Sequence[float]], depth: int, topk: int) -> list[list[float]]:
    """q for `depth` levels of `topk` ranks as a beam tree takes it: ranks (or depths) q
    lacks, and zeros, become TINY."""
    rows = []
    for d in range(depth):
        row = [p if p > 0 else TINY for p in (q[d][:topk] if d < len(q) else ())]
        rows.append(row + [TINY] * (topk - len(row)))
    return rows


def beam_node_probs(q: Sequence[Sequence[float]], depth: int, topk: int) -> tuple[float, ...]:
    """P(v) of every draft node of the beam tree (depth, topk) under q, largest first."""
    return _beam_node_probs(tuple(tuple(r) for r in beam_rows(q, depth, topk)), depth, topk)


@functools.lru_cache(maxsize=512)
def _beam_node_probs(rows: tuple, depth: int, topk: int) -> tuple[float, ...]:
    from bole_cli.trees import beam_tree

    tree = beam_tree(depth, topk, level_probs=[list(r) for r in rows])
    return tuple(sorted(tree.rho[1:], reverse=True))


def batch_expected(probs: Sequence[float], n_total: int, batch: int) -> Optional[float]:
    """E_b(N) for `batch` requests whose trees hold draft nodes of probabilities `probs`
    (largest first), sharing N tokens (None if N < b: every request needs its root)."""
    if n_total < batch:
        return None
    full, rest = divmod(n_total - batch, batch)  # drafts each, and how many get one more
    if full >= len(probs):
        full, rest = len(probs), 0
    lo = math.fsum(probs[:full])
    nxt = probs[full] if full < len(probs) else 0.0
    return batch * (1.0 + lo) + rest * nxt


@dataclass
class AcceptanceModel:
    """E[committed tokens] per request as a function of its tree tokens n (root included)."""

    name: str
    source: str
    q: Optional[list[list[float]]] = None  # per depth, per rank
    curve_n: Optional[list[float]] = None  # or a measured curve E1(n)
    curve_e: Optional[list[float]] = None
    measured: Optional[dict] = None  # a measured file's provenance summary (describe())

    @property
    def depth(self) -> int:
        """Draft depth the model describes (the paper's for a measured curve)."""
        return len(self.q) if self.q else PAPER_DEPTH

    @property
    def top_k(self) -> int:
        """Ranks per depth the model describes (the paper's for a measured curve)."""
        return max(len(r) for r in self.q) if self.q else DEFAULT_TOP_K

    @property
    def shape(self) -> tuple[int, int]:
        """(depth, top-k) of the model's own beam tree: its depths and its ranks, fewer
        ranks where the tree would exceed the kernels' 256 nodes (top-k 6 at depth 8)."""
        from bole_cli.limits import MAX_TREE_NODES
        from bole_cli.trees.generators import beam_tree_size

        k = self.top_k
        while k > 1 and beam_tree_size(self.depth, k) > MAX_TREE_NODES:
            k -= 1
        return self.depth, k

    def tree(self, n_total: int, batch: int = 1, depth: Optional[int] = None,
             topk: Optional[int] = None) -> Optional[float]:
        """E_b(N): committed tokens of `batch` requests drafting the beam tree (depth,
        topk; default the model's own `shape`) and sharing N tree tokens (None if N <
        batch). A measured curve knows one shape only: batch * E1(N / batch)."""
        if n_total < batch:
            return None
        if self.q is None:
            return batch * _interp(self.curve_n, self.curve_e, n_total / batch)
        own_depth, own_topk = self.shape
        probs = beam_node_probs(self.q, depth or own_depth, topk or own_topk)
        return batch_expected(probs, n_total, batch)

    def per_request(self, n: float) -> float:
        """E1(n): committed tokens (bonus included) for one request with n tree tokens of
        the model's beam tree; linear between integers."""
        if n < 1:
            raise ValueError("a request needs at least its root token")
        if self.curve_n is not None:
            return _interp(self.curve_n, self.curve_e, n)
        lo, hi = self.tree(int(math.floor(n))), self.tree(int(math.floor(n)) + 1)
        return lo + (n - math.floor(n)) * (hi - lo)

    def batch(self, n_total: int, batch: int) -> Optional[float]:
        """E_b(N) at the model's own beam shape (see `tree`)."""
        return self.tree(n_total, batch)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "source": self.source}
        if self.q is not None:
            d["per_depth_rank"] = [[round(x, 5) for x in row] for row in self.q]
        else:
            d["curve"] = {"n": list(self.curve_n or []), "e_acc": list(self.curve_e or [])}
        if self.measured is not None:
            d["measured"] = dict(self.measured)
        return d

    def chain(self, depth: Optional[int] = None) -> float:
        """E1 of a chain (the rank-1 path of q) of `depth` drafts (all depths if None)."""
        if self.q is None:
            raise ValueError("a measured curve has no chain")
        total, p = 1.0, 1.0
        for row in self.q[:depth]:
            p *= row[0] if row else 0.0
            total += p
        return total


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def preset_top1(name: str) -> float:
    """The preset's top-1 acceptance at depth 1 (its q for any depth and top-k follows)."""
    return _PRESET_A1[name]


def preset(name: str) -> AcceptanceModel:
    a1 = _PRESET_A1[name]
    return AcceptanceModel(
        name=name,
        source=(f"built-in: per-depth top-1 acceptance {a1} x {DEPTH_DECAY}^(d-1), depth {PAPER_DEPTH}, "
                f"top-k {DEFAULT_TOP_K}, rank factor {DEFAULT_RANK_FACTOR}; its beam tree at budget "
                f"{PAPER_BUDGET} commits the paper's mean accepted tokens {PRESET_TARGETS[name]}"),
        q=preset_rows(a1),
    )


# ---- files ----------------------------------------------------------------------------------
def _numbers(value: Any, where: str, *, lo: float = 0.0, hi: float = math.inf) -> list[float]:
    if not isinstance(value, list) or not value or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
    ):
        raise InputError(f"{where}: expected a non-empty list of numbers")
    for i, x in enumerate(value):
        if not (lo <= x <= hi and _finite(x)):
            raise InputError(f"{where}[{i}]: {brief(x)} is not a finite number in [{lo}, {hi}]")
    return [float(x) for x in value]


def _finite(x: "int | float") -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past float's range
        return False


def _at_most_drafts(count: int, where: str, what: str) -> None:
    if count > MAX_TREE_DRAFTS:
        raise InputError(f"{where}: {count} {what}; a tree of at most {MAX_TREE_NODES} nodes "
                         f"uses at most {MAX_TREE_DRAFTS}")


def check_rank_rows(rows: Any, where: str) -> list[list[float]]:
    """per_depth_rank, from a file or a profile: a list of per-rank probability rows (each
    summing to at most 1), at most MAX_TREE_DRAFTS depths and ranks."""
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{where}: expected a list of per-rank lists")
    _at_most_drafts(len(rows), where, "depths")
    q = []
    for d, row in enumerate(rows):
        row = _numbers(row, f"{where}[{d}]", hi=1.0)
        _at_most_drafts(len(row), f"{where}[{d}]", "ranks")
        if math.fsum(row) > 1 + 1e-9:
            raise InputError(f"{where}[{d}]: probabilities sum above 1")
        q.append(row)
    return q


def check_curve(curve: Any, where: str) -> tuple[list[float], list[float]]:
    """A measured curve {n, e_acc}, from a file or a profile: n strictly increasing tree
    tokens, e_acc non-decreasing committed tokens (bonus included), finite, at least 1 and
    never more than the n tokens verified (n - 1 drafts and the bonus token)."""
    if not isinstance(curve, dict):
        raise InputError(f"{where}: expected a mapping with n and e_acc")
    ns = _numbers(curve.get("n"), f"{where}.n", lo=1.0)
    es = _numbers(curve.get("e_acc"), f"{where}.e_acc", lo=1.0)
    if len(ns) != len(es):
        raise InputError(f"{where}: n and e_acc differ in length")
    if any(b <= a for a, b in zip(ns, ns[1:])):
        raise InputError(f"{where}.n: expected strictly increasing values")
    if any(b < a for a, b in zip(es, es[1:])):
        raise InputError(f"{where}.e_acc: expected non-decreasing values")
    for i, (n, e) in enumerate(zip(ns, es)):
        if e > n:
            raise InputError(f"{where}.e_acc[{i}]: {e:g} committed tokens from a tree of "
                             f"{n:g}; at most {n:g} (its drafts and the bonus token)")
    return ns, es


#: Every top-level key an acceptance file may hold (module docstring): the model, a histogram's
#: settings (calibrate/histogram_file.py), what `bole acceptance` writes besides the matrix,
#: and a profile's acceptance block (describe(): source, measured), which reads back as a file.
ACCEPTANCE_KEYS = ("name", "per_depth", "per_depth_rank", "curve", "accepted_length_histogram",
                   "top_k", "rank_factor", "speculative", "extrapolate_to", "interval_level",
                   "bole_acceptance", "measurement", "expected", "source", "measured")


def from_data(data: Any, source: str) -> AcceptanceModel:
    """Build a model from a parsed acceptance file (see the module docstring for the keys)."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with per_depth, per_depth_rank or curve")
    check_fields(data, ACCEPTANCE_KEYS, source)
    name = str(data.get("name") or Path(source).stem)
    top_k = data.get("top_k", DEFAULT_TOP_K)
    rank_factor = data.get("rank_factor", DEFAULT_RANK_FACTOR)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise InputError(f"{source}: top_k: expected a positive integer")
    _at_most_drafts(top_k, f"{source}: top_k", "ranks")
    if not isinstance(rank_factor, (int, float)) or not 0 <= rank_factor <= 1:
        raise InputError(f"{source}: rank_factor: expected a number in [0, 1]")
    present = [k for k in ("per_depth", "per_depth_rank", "curve", "accepted_length_histogram")
               if k in data]
    if len(present) != 1:
        raise InputError(f"{source}: give exactly one of per_depth, per_depth_rank, curve, "
                         "accepted_length_histogram")
    key = present[0]
    if key in ("per_depth_rank", "curve") and "rank_factor" in data:  # it would do nothing, silently
        raise InputError(f"{source}: rank_factor: not read with {key} (it sets the ranks below the "
                         "first from per_depth only)")
    if key == "accepted_length_histogram":  # observed per-step histograms: calibrate/observed.py
        from bole_cli.calibrate.observed import fit_observed

        for extra in ("top_k", "rank_factor"):  # the histogram's settings fix them
            if extra in data:
                raise InputError(f"{source}: {extra}: not read with accepted_length_histogram "
                                 "(speculative.topk sets the ranks; the fit sets the factor)")
        fit = fit_observed(data, source)
        return AcceptanceModel(name, fit.source, q=fit.q, measured=fit.measured)
    if key == "per_depth":
        per_depth = _numbers(data[key], f"{source}: per_depth", hi=1.0)
        _at_most_drafts(len(per_depth), f"{source}: per_depth", "depths")
        return AcceptanceModel(name, f"file {source} (per-depth top-1, top-k {top_k})",
                               q=rank_matrix(per_depth, top_k, float(rank_factor)))
    if key == "per_depth_rank":
        q = check_rank_rows(data[key], f"{source}: per_depth_rank")
        if "measurement" in data:
            summary = _check_measurement(data["measurement"], q, source)
            return AcceptanceModel(name, f"file {source} (measured: {summary['what']})", q=q,
                                   measured=summary)
        return AcceptanceModel(name, f"file {source} (per-depth, per-rank)", q=q)
    ns, es = check_curve(data[key], f"{source}: curve")
    if ns[0] > 1:
        ns, es = [1.0] + ns, [1.0] + es
    return AcceptanceModel(name, f"file {source} (measured curve)", curve_n=ns, curve_e=es)


# ---- measured files (bole acceptance) ---------------------------------------------------------
MEASURED_FORMAT = 1
#: Written matrices keep this many digits; from_data allows this much from counts / trials.
MEASURED_DIGITS = 6


def _counts(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise InputError(f"{where}: expected a list of non-negative integers")
    return list(value)


def _check_measurement(block: Any, q: list[list[float]], source: str) -> dict:
    """A measured file's `measurement` block agrees with its matrix; returns the summary
    that travels into profiles (AcceptanceModel.measured)."""
    where = f"{source}: measurement"
    if not isinstance(block, dict):
        raise InputError(f"{where}: expected a mapping")
    trials = _counts(block.get("trials"), f"{where}.trials")
    counts = block.get("counts")
    if len(trials) != len(q) or not isinstance(counts, list) or len(counts) != len(q):
        raise InputError(f"{where}: trials and counts need one entry per depth of "
                         f"per_depth_rank ({len(q)})")
    for d, (row, t) in enumerate(zip(counts, trials)):
        row = _counts(row, f"{where}.counts[{d}]")
        if len(row) != len(q[d]):
            raise InputError(f"{where}.counts[{d}]: {len(row)} ranks, per_depth_rank has "
                             f"{len(q[d])}")
        if sum(row) > t:
            raise InputError(f"{where}.counts[{d}]: more hits than trials ({t})")
        for r, c in enumerate(row):
            if abs((c / t if t else 0.0) - q[d][r]) > 10.0 ** -(MEASURED_DIGITS - 1):
                raise InputError(f"{source}: per_depth_rank[{d}][{r}] is {q[d][r]}, but the "
                                 f"measurement counts {c} of {t}")
    prompts = block.get("prompts") if isinstance(block.get("prompts"), dict) else {}
    summary = {k: block[k] for k in ("checkpoint", "model_type", "anchors", "partial", "date")
               if k in block}
    summary.update({f"prompts_{k}": prompts[k] for k in ("file", "sha256", "count")
                    if k in prompts})
    summary["what"] = (f"{block.get('checkpoint', '?')}, {block.get('anchors', '?')} anchors"
                       + (", PARTIAL" if block.get("partial") else ""))
    return summary


def measured_document(name: str, counts: list[list[int]], trials: list[int],
                      measurement: dict, expected: Optional[dict] = None) -> dict:
    """The acceptance file `bole acceptance` writes (module docstring): the matrix from
    the counts, then the measurement (whose trials/counts are these) and `expected`."""
    q = [[round(c / t, MEASURED_DIGITS) if t else 0.0 for c in row]
         for row, t in zip(counts, trials)]
    doc: dict[str, Any] = {"name": name, "bole_acceptance": MEASURED_FORMAT,
                           "top_k": len(counts[0]) if counts else DEFAULT_TOP_K,
                           "per_depth_rank": q}
    doc["measurement"] = {**measurement, "trials": list(trials),
                          "counts": [list(r) for r in counts]}
    if expected is not None:
        doc["expected"] = expected
    return doc


def canonical_preset(spec: str) -> Optional[str]:
    """The preset `spec` names, or None: its exact name first (a preset wins over a file of
    its name, as a catalogue model does), else a file or folder there, else the name in any
    case (paper-MBPP, as --gpu takes H200)."""
    if spec in PRESET_TARGETS:
        return spec
    if os.path.lexists(spec):
        return None
    return {p.lower(): p for p in PRESET_TARGETS}.get(spec.strip().lower())


def load_acceptance(spec: str) -> AcceptanceModel:
    """A preset name (paper-mbpp, ...) or a YAML/JSON file."""
    name = canonical_preset(spec)
    if name is not None:
        return preset(name)
    if not spec.strip():
        raise InputError(f"--acceptance: an empty value; give a preset ({', '.join(PRESET_TARGETS)}) "
                         "or a file")
    path = Path(spec)
    if not os.path.lexists(path):
        raise InputError(
            f"--acceptance: {spec!r} is neither a preset ({', '.join(PRESET_TARGETS)}) nor a file"
        )
    # one safe reader for every user file: a symlink loop, a FIFO, a device, a directory,
    # a binary or oversized file, and a hostile YAML fail as one line naming the file
    from bole_cli.files import load_structured

    data = None
    try:
        data = load_structured(path)
        return from_data(data, spec)
    except InputError as exc:
        if isinstance(data, dict) and "bole_profile" in data:  # the likeliest wrong file
            block = data.get("acceptance")
            used = block.get("name") if isinstance(block, dict) else None
            raise InputError(f"--acceptance: {spec} is a calibration profile, not an acceptance file"
                             + (f" (it was calibrated with {used!r})" if used else "")) from None
        raise InputError(f"--acceptance: {exc}") from None
