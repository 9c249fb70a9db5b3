"""How to speculate in one (batch, KV) bucket: the choice with the most expected committed
tokens per second, drafting counted (docs/design.md §8).

    tokens/s(choice) = E[committed | choice] / (T_draft + T_verify(N) + T_sample(N))

over the choices
- none:  plain decoding, batch / (T_dec + T_sample(batch));
- chain: depth d (1..D) of top-1 drafts, N = batch * (d + 1) tokens, drafted in d levels
         of one row per request;
- tree:  depth d, top-k k (2..K) and batch budget N = batch * m: the beam tree SGLang's
         EAGLE worker and our drafter grow (level 1 one row per request, levels 2..d k rows),
         m tokens per request (SGLang's --speculative-num-draft-tokens is per request), at
         least 2, at most the beam tree's size and 256 (MAX_TREE_NODES).
E comes from the acceptance model (bole_cli.calibrate.acceptance: the same q for trees and
chains, so both are judged on one statistic), T_verify(N) (verify + commit) from the
calibrated curve (measured points only; a chain's N is measured too, see sweep.py),
T_draft from the per-level drafter cost of the bucket (measured or roofline), T_sample from
the bucket's sampling line. A chain's verify runs Bole's chain kernels through the plug-in
or SGLang's ReplaySSM; the forward is the same, and the two GDN kernels differ by less
than half a percent of a step (experiments/README.md rows I15-d, I15-e), so one time serves
both and `verify` names the default.

Ties go to the simpler mode (none, then chain, then tree), then to less drafting.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from bole_cli.calibrate.acceptance import AcceptanceModel
from bole_cli.calibrate.selection import envelope
from bole_cli.limits import MAX_TREE_NODES
from bole_cli.trees.generators import beam_tree_size

MODES = ("none", "chain", "tree")
CHAIN_VERIFY = "bole"  # the plug-in's chain path; "replayssm" is SGLang's own (same cost)
MAX_CHAIN_DEPTH = 8  # SGLang's draft windows go to 8; chains deeper than that gain < 1%


@dataclass(frozen=True)
class Choice:
    """One way to run a step, with its predicted cost (seconds) and yield."""

    mode: str  # none | chain | tree
    depth: int  # draft levels (0 for none)
    topk: int  # 0 none, 1 chain, >= 2 tree
    budget: int  # tokens verified per step over the batch (roots included)
    tokens: float  # expected committed tokens per step, whole batch
    t_draft: float
    t_verify: float  # verify + commit (the decode step for none)
    t_sample: float
    verify: str  # decode | bole | replayssm

    @property
    def step_s(self) -> float:
        return self.t_draft + self.t_verify + self.t_sample

    @property
    def tok_s(self) -> float:
        return self.tokens / self.step_s

    def label(self) -> str:
        if self.mode == "none":
            return "no speculation"
        if self.mode == "chain":
            return f"chain d={self.depth}"
        return f"tree {self.depth}x{self.topk} N={self.budget}"

    def to_dict(self, plain_tok_s: float) -> dict[str, Any]:
        d = asdict(self)
        d.update(step_s=self.step_s, tok_s=self.tok_s, speedup=self.tok_s / plain_tok_s,
                 label=self.label())
        return d


@dataclass(frozen=True)
class BucketCosts:
    """What one (batch, kv_len) bucket costs: the calibrated curve and the drafter."""

    batch: int
    kv_len: int
    t_dec: float
    n: Sequence[int]
    t_ver: Sequence[float]
    draft_level: Sequence[float]  # seconds of one drafter level with r rows per request, r = 1..
    sample_fixed: float  # T_sample(N) = sample_fixed + sample_per_token * N
    sample_per_token: float

    def sample(self, tokens: int) -> float:
        return self.sample_fixed + self.sample_per_token * tokens

    @functools.cached_property
    def _curve(self) -> dict[int, float]:
        """Measured point -> T_verify on the curve's running maximum (computed once)."""
        return dict(zip(self.n, envelope(self.t_ver)))

    def verify(self, tokens: int) -> Optional[float]:
        """T_verify at a measured point (on the running maximum); None elsewhere."""
        return self._curve.get(tokens)

    def verify_between(self, tokens: int) -> Optional[float]:
        """T_verify linearly between measured points (None outside them)."""
        n, t = list(self._curve), list(self._curve.values())
        if not n or not n[0] <= tokens <= n[-1]:
            return None
        for (n0, t0), (n1, t1) in zip(zip(n, t), zip(n[1:], t[1:])):
            if n0 <= tokens <= n1:
                return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
        return t[0]

    def draft(self, depth: int, topk: int) -> Optional[float]:
        """Level 1 on one row per request, then depth - 1 levels of `topk` rows."""
        if depth == 0:
            return 0.0
        rows = 1 if depth == 1 else topk
        if rows > len(self.draft_level):
            return None
        return self.draft_level[0] + (depth - 1) * self.draft_level[rows - 1]


@dataclass(frozen=True)
class Decision:
    chosen: Choice
    runner_up: Optional[Choice]  # the best choice of another mode
    best: dict[str, Choice]  # per mode
    plain: Choice
    considered: int

    def to_dict(self) -> dict[str, Any]:
        base = self.plain.tok_s
        return {
            "mode": self.chosen.mode,
            "chosen": self.chosen.to_dict(base),
            "runner_up": self.runner_up.to_dict(base) if self.runner_up else None,
            "best": {m: c.to_dict(base) for m, c in self.best.items()},
            "considered": self.considered,
        }


def _rank(c: Choice) -> tuple:
    """Faster first; equal to 9 significant digits (a tree whose extra ranks add only the
    1e-12 placeholders of absent ranks ties its chain), the simpler mode, then less
    drafting, then the smaller budget."""
    return (-float(f"{c.tok_s:.9g}"), MODES.index(c.mode), c.t_draft, c.budget)


def candidates(costs: BucketCosts, acceptance: Optional[AcceptanceModel], *,
               max_depth: Optional[int] = None, max_topk: Optional[int] = None,
               modes: Sequence[str] = MODES) -> list[Choice]:
    """Every choice the bucket's measurements and the acceptance model can price."""
    b = costs.batch
    out: list[Choice] = []
    if "none" in modes:
        out.append(Choice("none", 0, 0, b, float(b), 0.0, costs.t_dec, costs.sample(b), "decode"))
    if acceptance is None:
        return out
    depth_cap = min(max_depth or acceptance.depth, acceptance.depth)
    topk_cap = min(max_topk or acceptance.top_k, acceptance.top_k)
    if "chain" in modes and acceptance.q is not None:
        for d in range(1, min(depth_cap, MAX_CHAIN_DEPTH) + 1):
            n = b * (d + 1)
            t_ver, t_draft = costs.verify(n), costs.draft(d, 1)
            if t_ver is None or t_draft is None:
                continue
            out.append(Choice("chain", d, 1, n, b * acceptance.chain(d), t_draft, t_ver,
                              costs.sample(n), CHAIN_VERIFY))
    if "tree" in modes:
        shapes = ([(d, k) for d in range(1, depth_cap + 1) for k in range(2, topk_cap + 1)]
                  if acceptance.q is not None else [(acceptance.depth, acceptance.top_k)])
        for d, k in shapes:
            t_draft = costs.draft(d, k)
            size = beam_tree_size(d, k)
            if t_draft is None or size > MAX_TREE_NODES:
                continue
            for n in costs.n:  # one tree per request: SGLang's draft tokens are per request
                if n % b or not 2 <= n // b <= size:
                    continue
                e = acceptance.tree(n, b, d, k)
                out.append(Choice("tree", d, k, n, e, t_draft, costs.verify(n), costs.sample(n),
                                  "bole"))
    return out


def decide(costs: BucketCosts, acceptance: Optional[AcceptanceModel], **options: Any) -> Decision:
    """The fastest choice of the bucket, the best of each mode and the runner-up."""
    options.setdefault("modes", MODES)
    if "none" not in options["modes"]:
        options["modes"] = ("none",) + tuple(options["modes"])  # the yardstick
    pool = candidates(costs, acceptance, **options)
    best: dict[str, Choice] = {}
    for c in sorted(pool, key=_rank):
        best.setdefault(c.mode, c)
    chosen = min(best.values(), key=_rank)
    others = [c for m, c in best.items() if m != chosen.mode]
    return Decision(chosen, min(others, key=_rank) if others else None, best, best["none"],
                    len(pool))


def chain_points(batch: int, max_depth: int = MAX_CHAIN_DEPTH) -> list[int]:
    """The verify sizes a chain of depth 1..max_depth needs at `batch` (sweep.py times them)."""
    return [batch * (d + 1) for d in range(1, max_depth + 1)]


def tree_cap(acceptance: Optional[AcceptanceModel]) -> int:
    """The most tokens one request's tree can hold under the model's shape (and the kernels')."""
    if acceptance is None:
        return MAX_TREE_NODES
    return min(MAX_TREE_NODES, max(beam_tree_size(acceptance.depth, k)
                                   for k in range(1, acceptance.top_k + 1)
                                   if beam_tree_size(acceptance.depth, k) <= MAX_TREE_NODES))


def price(costs: BucketCosts, acceptance: AcceptanceModel, mode: str, depth: int = 0,
          topk: int = 0, budget: Optional[int] = None) -> Optional[Choice]:
    """The objective's price of one given configuration (what `bole bench e2e` prints beside
    its measurement): None where the bucket's measurements cannot price it. The verify time
    is interpolated between measured points (a configuration the sweep did not time)."""
    b = costs.batch
    if mode == "none":
        return Choice("none", 0, 0, b, float(b), 0.0, costs.t_dec, costs.sample(b), "decode")
    n = b * (depth + 1) if mode == "chain" else budget
    t_ver = costs.verify_between(n) if n is not None else None
    t_draft = costs.draft(depth, 1 if mode == "chain" else topk)
    if t_ver is None or t_draft is None:
        return None
    if mode == "chain":
        tokens = b * acceptance.chain(depth)
    else:
        tokens = acceptance.tree(n, b, depth, topk)
    return Choice(mode, depth, 1 if mode == "chain" else topk, n, tokens, t_draft, t_ver,
                  costs.sample(n), CHAIN_VERIFY if mode == "chain" else "bole")
