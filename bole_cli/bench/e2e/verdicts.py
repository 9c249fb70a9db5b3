"""What `bole bench e2e`'s runs add up to, from its RunResults: the best run of each decoder
per batch and who wins (tree against chain, with the acceptance ceiling of the gain), the
drafter's cost per level against its weight-read floor, the greedy exactness verdict, the
speedups over AR and whether snapshot and Bole accepted alike. The sweep runs (sweep.py),
this module judges (docs/design.md §8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from bole_cli.bench.e2e.decoders import BOLE_DECODERS
from bole_cli.bench.e2e.options import TREE_DECODERS


@dataclass
class Verdicts:
    """What the runs of one sweep add up to (judge)."""

    same_acceptance: dict[str, bool]  # batch -> snapshot and Bole accepted the same nodes
    comparison: list[dict]
    drafter_levels: dict
    exact: Optional[dict]  # greedy acceptance only


def judge(results: list[Any], batches, bench: Any, depth: int) -> Verdicts:
    """Every verdict of a sweep; sets each run's speedup over AR at its batch first."""
    set_speedups(results)
    return Verdicts(same_acceptance(results, batches), compare_decoders(results, batches, bench, depth),
                    drafter_cost(results, bench), exactness(results) if bench.acceptance.greedy else None)


def set_speedups(results: list[Any]) -> None:
    """Each run's tokens/s over AR's at the same batch (where both ran)."""
    ar = {r.batch: r.tok_s for r in results if r.decoder == "ar" and r.tok_s}
    for r in results:
        if r.tok_s and ar.get(r.batch):
            r.speedup_vs_ar = r.tok_s / ar[r.batch]


def same_acceptance(results: list[Any], batches) -> dict[str, bool]:
    """Per batch where both ran whole: whether snapshot and Bole accepted the same nodes at
    every (shape, budget), step by step (the same trees and draws: they must). Both run the
    sweep's trees in the same order, so their i-th runs pair up."""
    same = {}
    for b in batches:
        snapshot, bole = ([r.accept_trace for r in results if r.batch == b and r.decoder == name]
                          for name in TREE_DECODERS)
        if snapshot and len(snapshot) == len(bole) and None not in snapshot + bole:
            same[str(b)] = snapshot == bole
    return same


def compare_decoders(results: list[Any], batches, bench: Any, depth: int) -> list[dict]:
    """Per batch: every decoder's best run (chains: the best swept depth), the winner, Bole's
    best (tree or chain) over the best ReplaySSM chain, and the acceptance ceiling of that
    gain: expected committed tokens of the tree over the chain at the same depth."""
    out = []
    for b in batches:
        best: dict[str, dict] = {}
        for r in results:
            if r.batch != b or not r.tok_s:
                continue
            if r.decoder not in best or r.tok_s > best[r.decoder]["tok_s"]:
                best[r.decoder] = {"tok_s": r.tok_s, "chain_depth": r.chain_depth, "budget": r.budget,
                                   "tree_shape": r.tree_shape, "mean_accepted": r.mean_accepted,
                                   "expected": r.expected_accepted, "phase_ms": r.phase_ms,
                                   "predicted_tok_s": r.predicted_tok_s}
        row: dict[str, Any] = {"batch": b, "best": best}
        if best:
            winner = max(best, key=lambda n: best[n]["tok_s"])
            rest = [v["tok_s"] for n, v in best.items() if n != winner]
            row["winner"] = winner
            row["margin"] = best[winner]["tok_s"] / max(rest) if rest else None
        bole = [best[n]["tok_s"] for n in BOLE_DECODERS if n in best]
        if bole and "chain" in best:
            row["bole_over_replayssm"] = max(bole) / best["chain"]["tok_s"]
            tree = best["bole"]["expected"] if "bole" in best else bench.plan(b).expected
            tree_depth = (best.get("bole") or {}).get("tree_shape") or (depth,)
            # the tree at its best budget and shape, over the chain at the same depth
            row["ceiling"] = tree / bench.chain_plan(b, min(tree_depth[0], depth)).expected
            realised, ceiling = row["bole_over_replayssm"], row["ceiling"]
            row["target_met"] = realised >= 1.0 and (b > 4 or realised - 1 >= 0.9 * (ceiling - 1))
        out.append(row)
    return out


def drafter_cost(results: list[Any], bench: Any) -> dict:
    """The drafter's measured time per level against its weight-read floor (the bytes one
    level must read / the measured copy bandwidth), from the chain runs (one row per request
    per level: draft ms / d) and the tree runs (draft ms / depth, top-k rows per level)."""
    if bench.device.type != "cuda":
        return {"skipped": "needs CUDA (the floor is a GPU's bandwidth)"}
    from bole_cli.timing import measure_copy_bandwidth

    bw = measure_copy_bandwidth(torch)
    rows = []
    for r in results:
        if not r.tok_s or r.decoder == "ar" or not r.phase_ms:
            continue
        shape = r.tree_shape or bench.shape
        levels = r.chain_depth or shape[0]
        per_row = 1 if r.chain_depth else shape[1]
        floor = bench.drafter.level_read_bytes(r.batch, bench.context, per_row) / bw * 1e3
        ms = r.phase_ms["draft"] / levels
        rows.append({"decoder": r.decoder, "batch": r.batch, "levels": levels, "ms_per_level": ms,
                     "floor_ms": floor, "over_floor": ms / floor})
    return {"copy_bandwidth_tb_s": bw / 1e12, "draft_vocab": bench.drafter.draft_vocab, "rows": rows}


def exactness(results: list[Any]) -> dict:
    """Greedy acceptance: whether every decoder (autoregressive included) emitted the same
    token stream, compared over each request's common prefix at each batch."""
    mismatches, compared = [], 0
    for b in sorted({r.batch for r in results}):
        runs = [r for r in results if r.batch == b and r.streams is not None]
        ref = next((r for r in runs if r.decoder == "ar"), runs[0] if runs else None)
        for r in runs:
            if r is ref:
                continue
            compared += 1
            for i, (want, got) in enumerate(zip(ref.streams, r.streams)):
                n = min(len(want), len(got))
                if want[:n] != got[:n]:
                    at = next(j for j in range(n) if want[j] != got[j])
                    name = r.decoder + (f" d={r.chain_depth}" if r.chain_depth else "")
                    mismatches.append(f"batch {b}, request {i}: {name} differs from {ref.decoder} at token {at}")
                    break
    failed = [f"{r.decoder} at batch {r.batch}: {r.error}" for r in results if r.error]
    return {"identical": not mismatches and not failed and compared > 0, "compared_runs": compared,
            "mismatches": mismatches, "failed": failed}
