"""What `bole inspect-tree` reports: a batch of draft trees, what a budget keeps, the memory.

`inspect_trees` checks which options go together, loads the trees (a file, SGLang's
arrays or a synthetic EAGLE-style beam), applies the batch budget (docs/design.md §4),
sizes the transient verify memory (bole_cli.memory) and builds the report: the command's
JSON and what its Rich view reads. Trees, budget, memory and plotting load inside the
functions so the command module stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from bole_cli.errors import InputError
from bole_cli.limits import MAX_BATCH_REQUESTS, MAX_SEED, MAX_TREE_DRAFTS, MAX_TREE_NODES
from bole_cli.parsing import check_int

MASK_MAX_NODES = 32  # the ancestor mask is reported for trees up to this size
#: Node lines the screen draws: past them the rest of the batch is summed up in the table
#: (and --json holds every node); drawing a million nodes would take minutes to scroll by.
DRAW_MAX_NODES = 2048
SYNTHETIC_DEFAULTS = {"depth": 8, "topk": 4, "seed": 0, "requests": 1}
MIN_PER_REQUEST = 1  # --min-per-request when not given: each request keeps its root
STATE_DTYPE = "float32"  # --state-dtype when not given
MAX_REQUESTS = MAX_BATCH_REQUESTS


@dataclass(frozen=True)
class TreeInspection:
    """The loaded trees, the budget's selection and the memory figures (None when not
    asked for), and `report`, the JSON-ready dict built from them."""

    trees: list
    selection: Any
    memory: Any
    report: dict


def _as_path(value: "str | Path | None", flag: str) -> Optional[Path]:
    """Path(value), refusing "" (which Path would read as the current directory)."""
    if value is None:
        return None
    if not str(value).strip():
        raise InputError(f"{flag}: an empty path was given; name a file")
    return Path(value)


def check_options(*, tree_file: Optional[Path], sglang: Optional[Path], synthetic: bool,
                  synthetic_options: dict, budget: Optional[int], budget_options: dict,
                  model: Optional[str], model_options: dict, plot: Optional[Path]) -> None:
    """InputError naming the flag when the options do not go together. The *_options
    dicts map a flag (--depth) to its value, None when not given."""
    from bole_cli.inspection.plot import PLOT_SUFFIXES

    sources = [name for name, given in (("TREE_FILE", tree_file is not None),
                                         ("--sglang", sglang is not None),
                                         ("--synthetic", synthetic)) if given]
    if len(sources) != 1:
        which = "none" if not sources else " and ".join(sources)
        raise InputError(f"give exactly one of TREE_FILE, --sglang FILE or --synthetic (got {which})")
    for needed, given, options in (("--synthetic", synthetic, synthetic_options),
                                   ("--budget", budget is not None, budget_options),
                                   ("--model", model is not None, model_options)):
        if not given:
            for flag, value in options.items():
                if value is not None:
                    raise InputError(f"{flag} only applies with {needed}")
    if plot is not None:  # a folder before its suffix (it has none to name); a long name first
        from bole_cli.console import check_name_lengths

        check_name_lengths(plot, "--plot")
        if plot.is_dir():
            raise InputError(f"--plot: {plot} is a directory; give a .png, .svg or .pdf file path")
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot {plot}: unsupported file type {plot.suffix or '(none)'!r}; "
                         "use .png, .svg or .pdf")
    check_int(synthetic_options.get("--depth"), "--depth", maximum=MAX_TREE_DRAFTS)
    check_int(synthetic_options.get("--topk"), "--topk", maximum=MAX_TREE_DRAFTS)
    check_int(synthetic_options.get("--seed"), "--seed", minimum=0, maximum=MAX_SEED)
    check_int(budget, "--budget")
    check_int(budget_options.get("--min-per-request"), "--min-per-request", minimum=0)
    check_int(budget_options.get("--max-per-request"), "--max-per-request")
    check_int(model_options.get("--batch"), "--batch", maximum=MAX_BATCH_REQUESTS)
    check_int(model_options.get("--nodes"), "--nodes", maximum=MAX_TREE_NODES)
    if model_options.get("--state-dtype") is not None:  # before the trees load, named as the option
        from bole_cli.memory import dtype_bytes

        try:
            dtype_bytes(model_options["--state-dtype"])
        except InputError as exc:
            raise InputError(f"--state-dtype: {exc}") from None
    if plot is not None:
        from bole_cli.console import check_writable

        check_writable(plot, "--plot")


def load_source(tree_file: Optional[Path], sglang: Optional[Path], *, depth: Optional[int] = None,
                topk: Optional[int] = None, seed: Optional[int] = None,
                requests: Optional[int] = None) -> tuple[list, dict]:
    """(trees, source): from a tree file, from SGLang's arrays, else a synthetic beam."""
    from bole_cli import trees as T

    if tree_file is not None:
        return T.load_trees(tree_file), {"kind": "file", "path": str(tree_file)}
    if sglang is not None:
        return T.load_sglang(sglang), {"kind": "sglang", "path": str(sglang)}
    given = {"depth": depth, "topk": topk, "seed": seed, "requests": requests}
    opts = {k: SYNTHETIC_DEFAULTS[k] if v is None else v for k, v in given.items()}
    check_int(opts["requests"], "--requests", maximum=MAX_REQUESTS)
    try:
        trees = [T.beam_tree(opts["depth"], opts["topk"], opts["seed"] + r)
                 for r in range(opts["requests"])]
    except InputError as exc:
        raise InputError(f"--synthetic: {exc}") from None
    return trees, {"kind": "synthetic", **opts}


def build_report(trees: Sequence, source: dict, selection: Any = None,
                 memory: Any = None) -> dict[str, Any]:
    """Per request and in sum: shape, scores, what the budget keeps; the budget and memory."""
    reqs = []
    for b, t in enumerate(trees):
        kept = selection.kept_mask(b, t.n_nodes) if selection else None
        reqs.append({
            "index": b,
            "nodes": t.n_nodes,
            "depth": t.draft_depth,  # draft levels below the root (the text's d, --depth)
            "widths": list(t.widths),  # nodes on each level, the root's (0) first
            "parents": list(t.parents),
            "log_probs": list(t.log_probs),
            "probs": list(t.probs),
            "log_rho": list(t.log_rho),
            "rho": list(t.rho),
            "depths": [d - 1 for d in t.depths],  # each node's level (the root, the verified token: 0)
            "tokens": None if t.tokens is None else list(t.tokens),
            "expected_accepted": t.expected_accepted(),
            "kept": kept,
            "kept_nodes": len(selection.kept_ids[b]) if selection else None,
            "expected_accepted_budget": selection.expected_accepted[b] if selection else None,
            "ancestor_mask": t.ancestor_mask() if t.n_nodes <= MASK_MAX_NODES else None,
        })
    max_depth = max(t.depth for t in trees)
    widths = [0] * max_depth
    for t in trees:
        for d, w in enumerate(t.widths):
            widths[d] += w
    summary = {
        "requests": len(trees),
        "nodes": sum(t.n_nodes for t in trees),
        "depth": max_depth - 1,
        "widths": widths,
        "expected_accepted": sum(r["expected_accepted"] for r in reqs),
        "kept_nodes": selection.n_kept if selection else None,
        "expected_accepted_budget": sum(selection.expected_accepted) if selection else None,
    }
    return {
        "source": source,
        "requests": reqs,
        "summary": summary,
        "budget": selection.to_dict() if selection else None,
        "memory": memory.to_dict() if memory else None,
        "plot": None,
    }


def inspect_trees(*, tree_file: Optional[Path] = None, sglang: Optional[Path] = None,
                  synthetic: bool = False, depth: Optional[int] = None,
                  topk: Optional[int] = None, seed: Optional[int] = None,
                  requests: Optional[int] = None, budget: Optional[int] = None,
                  min_per_request: Optional[int] = None, max_per_request: Optional[int] = None,
                  model: Optional[str] = None, batch: Optional[int] = None,
                  nodes: Optional[int] = None, state_dtype: Optional[str] = None,
                  plot: Optional[Path] = None) -> TreeInspection:
    """Everything `bole inspect-tree` shows, checked, computed and (with `plot`) drawn."""
    tree_file, sglang, plot = (_as_path(tree_file, "TREE_FILE"), _as_path(sglang, "--sglang"),
                               _as_path(plot, "--plot"))
    check_options(tree_file=tree_file, sglang=sglang, synthetic=synthetic,
                  synthetic_options={"--depth": depth, "--topk": topk, "--seed": seed,
                                     "--requests": requests},
                  budget=budget, budget_options={"--min-per-request": min_per_request,
                                                 "--max-per-request": max_per_request},
                  model=model, model_options={"--batch": batch, "--nodes": nodes,
                                              "--state-dtype": state_dtype},
                  plot=plot)
    trees, source = load_source(tree_file, sglang, depth=depth, topk=topk, seed=seed,
                                requests=requests)
    selection = None
    if budget is not None:
        from bole_cli.budget import select_budget

        least = MIN_PER_REQUEST if min_per_request is None else min_per_request
        if max_per_request is not None and max_per_request < least:
            raise InputError(f"--max-per-request: {max_per_request} is smaller than "
                             f"{'--min-per-request' if min_per_request is not None else 'the minimum'} ({least})")
        try:
            selection = select_budget(
                trees, budget, min_per_request=least,
                max_per_request=max_per_request)
        except InputError as exc:
            raise InputError(f"--budget: {exc}") from None
    memory = None
    if model is not None:
        from bole_cli.catalog.models import resolve_model
        from bole_cli.memory import transient_memory

        spec = resolve_model(model)
        if nodes is None:
            sizes = selection.forest.sizes if selection else [t.n_nodes for t in trees]
            nodes = max(max(sizes), 1)
        memory = transient_memory(spec, len(trees) if batch is None else batch, nodes,
                                  state_dtype or STATE_DTYPE)
    report = build_report(trees, source, selection, memory)
    if plot is not None:
        from bole_cli.inspection.plot import plot_trees

        report["plot"] = str(plot_trees(trees, selection, plot))
    return TreeInspection(trees=trees, selection=selection, memory=memory, report=report)
