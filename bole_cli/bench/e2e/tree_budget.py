"""Which drafted nodes a step of `bole bench e2e` verifies: the batch budget and the kept trees.

Every step, each request drafts the same beam tree (bole_cli/bench/drafter.py); the batch
budget N keeps the N best nodes of the whole batch (bole_cli.budget.select_budget,
docs/design.md §4). N comes from `--budget`: a number, or this GPU and model's calibration
profile: the budget of the best tree its decision priced (docs/design.md §8; B_ver in a
profile without a decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from bole_cli.bench.drafter import DraftLayout
from bole_cli.bench.e2e.options import check_budget_covers_batch
from bole_cli.budget import BudgetSelection, select_budget
from bole_cli.calibrate.acceptance import PAPER_BUDGET
from bole_cli.catalog.models import ModelSpec


def resolve_budget(policy: "str | int", spec: ModelSpec, device_name: str, batch: int, context: int,
                   per_request_cap: int, draft_vocab: Optional[int] = None,
                   flag: str = "--budget") -> tuple[int, str]:
    """(N, where it came from): tree tokens verified per step over the whole batch; from the
    profile of the drafter that runs (`draft_vocab` hot tokens, None for all). `flag`: the
    option that gave a number (--budget, or one of --tree-budgets)."""
    if isinstance(policy, int):
        check_budget_covers_batch(policy, batch, flag)
        n, src = policy, f"{flag} {policy}"
    else:
        from bole_cli.catalog.hardware import match_gpu
        from bole_cli.profiles import drafter_words, find_profile, load_profile, lookup_budget

        gpu = match_gpu(device_name)
        path = find_profile(gpu.key, spec, draft_vocab=draft_vocab) if gpu is not None else None
        if path is None:  # none of this drafter's (find_profile skips another's)
            n = PAPER_BUDGET
            src = (f"no profile for ({gpu.key if gpu else device_name}, {spec.name}) drafting over "
                   f"{drafter_words(draft_vocab)}: the paper's {n}")
        else:
            entry, note = lookup_budget(load_profile(path), batch, context)
            if entry.get("n_star"):  # the best tree's budget under the decision's objective
                n = int(entry["n_star"])
                src = f"profile {path.parent.name}/{path.name}: the best tree's N {n} ({note})"
            else:
                n = int(entry["b_ver"])
                src = f"profile {path.parent.name}/{path.name}: B_ver {n} ({note}; no decision)"
            if entry["batch"] != batch:  # another batch's bucket: keep its tokens per request, as serve does
                scaled = n * batch // entry["batch"]
                src += f"; {n} over {entry['batch']} requests is {scaled} over {batch}"
                n = scaled
        if n < batch:
            src += f"; raised to {batch} (one node per request)"
            n = batch
    cap = batch * per_request_cap
    if n > cap:
        src += f"; {cap} kept (every drafted node)"
        n = cap
    return n, src


@dataclass
class TreePlan:
    """One batch's budget-selected trees. The tree shape and draft probabilities are the
    acceptance model's, the same every step, so the selection is made once per batch."""

    layout: DraftLayout
    batch: int
    budget: int
    source: str
    selection: BudgetSelection
    local: list[dict[int, int]]  # per request: layout node id -> local index in the kept tree
    kept_index: list[int]  # packed node -> row of the flattened [B, layout nodes] draft
    expected: float  # expected committed tokens per request and step
    q: tuple = ()  # the acceptance rows this tree's walk draws from (its own shape's)

    @property
    def forest(self):
        return self.selection.forest

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.selection.forest.sizes


def plan_trees(layout: DraftLayout, batch: int, budget: int, source: str = "",
               q=()) -> TreePlan:
    """Keep the `budget` best nodes of `batch` copies of the layout's tree; `q` are the
    acceptance rows its walk draws from."""
    sel = select_budget([layout.tree] * batch, budget)
    local = [{orig: j for j, orig in enumerate(ids)} for ids in sel.kept_ids]
    kept = [b * layout.n_nodes + orig for b, ids in enumerate(sel.kept_ids) for orig in ids]
    return TreePlan(layout, batch, budget, source, sel, local, kept,
                    math.fsum(sel.expected_accepted) / batch, tuple(tuple(r) for r in q))
