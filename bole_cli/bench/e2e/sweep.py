"""`bole bench e2e`'s run, from a checked E2EConfig (options.py): the sweep, the verdicts,
the largest-batch search, the document.

The sweep runs every (batch, decoder) on one E2EBench (harness.py): the chain decoders
once per swept depth, the tree decoders once per (shape, budget); then verdicts.py judges
the runs (speedups, tree against chain, the drafter's cost, greedy exactness), the search
finds the largest batch each decoder fits (CUDA only, chains at their best depth), and
report.py writes the JSON document it renders (docs/design.md §8: why the drafter's cost
is counted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from bole_cli.bench.e2e import report, verdicts
from bole_cli.bench.e2e.decoders import LABELS, decoder_class
from bole_cli.bench.e2e.harness import E2EBench, RunResult, free_memory
from bole_cli.bench.e2e.options import E2EConfig
from bole_cli.bench.e2e.prediction import ProfilePricer, profile_pricer


@dataclass
class Sweep:
    """Every timed run of one E2EBench, and the grid they ran over."""

    results: list[RunResult]
    shapes: tuple[tuple[int, int], ...]  # the tree shapes swept (depth, top-k)
    budgets: tuple  # the tree budgets swept (an int, or the "profile" policy)
    trees: list[tuple[tuple[int, int], Any]]  # (shape, budget) the tree decoders sweep, in run order
    chains: list[str]  # the chain decoders run
    replayssm: Optional[str]  # where SGLang's ReplaySSM came from, or why it did not run
    pricer: ProfilePricer
    interrupted: bool = False  # Ctrl-C or SIGTERM: the runs before it, the rest not run


@dataclass
class BatchSearch:
    """The largest batch of each decoder, or why the search was skipped."""

    found: dict[str, Any]
    skipped: str
    nodes_per_request: int


def build_bench(cfg: E2EConfig) -> E2EBench:
    return E2EBench(cfg.spec, device=cfg.device, dtype=getattr(torch, cfg.dtype), context=cfg.context,
                    depth=cfg.depth, topk=cfg.topk, acceptance=cfg.acceptance, budget=cfg.budget,
                    seed=cfg.seed, snapshot_engine=cfg.snapshot_engine, use_graphs=cfg.use_graphs,
                    warmup=cfg.warmup, steps=cfg.steps, draft_vocab=cfg.draft_vocab)


def run_sweep(cfg: E2EConfig, bench: E2EBench, progress: Callable[[str], None]) -> Sweep:
    """Every (batch, decoder) of `cfg`, each tree decoder at every (shape, budget), each chain
    decoder at every depth; a run that fails is kept with its error."""
    chains = [d for d in cfg.decoders if decoder_class(d).chain]
    replayssm_desc, replayssm_error = None, ""
    if "chain" in cfg.decoders:
        try:
            replayssm_desc = bench.use_replayssm()
        except Exception as exc:  # noqa: BLE001 - no wheel: the other decoders still run, and it is said
            replayssm_error = f"SGLang's ReplaySSM kernels did not load: {exc}"
            replayssm_desc = "not run (" + replayssm_error + ")"
    budgets = tuple(cfg.tree_budgets) or (cfg.budget,)
    if cfg.tree_budgets:
        bench.budget_flag = "--tree-budgets"
    shapes = tuple(cfg.tree_shapes) or ((cfg.depth, cfg.topk),)
    trees = [(shape, n) for shape in shapes for n in budgets]
    for b in cfg.batches:  # budget, shape and depth errors before any timing
        for shape, budget in trees if any(decoder_class(d).verifies_tree() for d in cfg.decoders) else ():
            bench.use_shape(*shape)
            bench.budget_policy = budget
            bench.plan(b)
        for d in cfg.chain_depths if chains else ():
            bench.chain_plan(b, d)
    bench.use_shape(*shapes[0])
    pricer = profile_pricer(cfg, bench)
    results: list[RunResult] = []
    try:
        _sweep_runs(cfg, bench, progress, shapes, budgets, trees, replayssm_error, pricer, results)
    except KeyboardInterrupt:  # keep the runs measured so far; the command writes them
        interrupted = True
    else:
        interrupted = False
    bench.budget_policy = budgets[0]
    bench.use_shape(*shapes[0])
    return Sweep(results, shapes, budgets, trees, chains, replayssm_desc, pricer, interrupted)


def _sweep_runs(cfg: E2EConfig, bench: E2EBench, progress: Callable[[str], None], shapes, budgets, trees,
                replayssm_error: str, pricer: ProfilePricer, results: list[RunResult]) -> None:
    """The runs of run_sweep, appended to `results` as each ends; a tree whose budget keeps
    the same nodes as an earlier budget's (both past the shape's nodes) is not run again."""
    planned: set = set()  # (decoder, batch, shape, nodes a request) of the tree runs made
    for b in cfg.batches:
        for name in cfg.decoders:
            kind = decoder_class(name)
            sweep = ([(None, None, d) for d in cfg.chain_depths] if kind.chain
                     else [(shape, n, None) for shape, n in trees] if kind.drafts
                     else [(None, None, None)])
            for shape, budget, depth in sweep:
                label = (f"{f' {shape[0]}x{shape[1]}' if shape and len(shapes) > 1 else ''}"
                         f"{f' N={budget}' if len(budgets) > 1 and budget else ''}")
                progress(f"{LABELS[name]}{f' d={depth}' if depth else ''}{label}, batch {b}")
                if depth:
                    bench.chain_depth = depth
                if shape is not None:
                    bench.use_shape(*shape)
                if budget is not None:
                    bench.budget_policy = budget
                if shape is not None:
                    key = (name, b, shape, tuple(kind.plan_for(bench, b).sizes))
                    if key in planned:
                        progress(f"{LABELS[name]}{label}, batch {b}: the trees of an earlier budget; not run again")
                        continue
                    planned.add(key)
                if name == "chain" and replayssm_error:
                    results.append(RunResult(name, b, chain_depth=depth, error=replayssm_error))
                    continue
                r = bench.run(name, b)
                r.chain_depth, r.tree_shape = depth, shape if kind.verifies_tree() else None
                r.predicted_tok_s = pricer(r)
                results.append(r)


def search_batches(cfg: E2EConfig, bench: E2EBench, comparison: list[dict],
                   progress: Callable[[str], None]) -> BatchSearch:
    """The largest batch of each decoder (the chains at the best depth of the smallest batch),
    probed with `--probe-nodes` tree tokens per request (default: the smallest batch's tree)."""
    nodes = cfg.probe_nodes
    if nodes is None:
        nodes = max(bench.plan(min(cfg.batches)).sizes) if any(
            decoder_class(d).verifies_tree() for d in cfg.decoders) else 1
    nodes = max(1, min(int(nodes), bench.layout.n_nodes))
    found: dict[str, Any] = {}
    skipped = ""
    if cfg.search and bench.device.type != "cuda":
        skipped = "skipped: needs CUDA (allocation failures on CPU mean host RAM)"
    elif not cfg.search:
        skipped = "skipped (--no-max-batch)"
    else:
        for name in cfg.decoders:
            if decoder_class(name).chain:  # at the best depth of the smallest batch
                best = comparison[0]["best"].get(name) if comparison else None
                bench.chain_depth = best["chain_depth"] if best else cfg.depth
            found[name] = bench.max_batch(name, max_batch=cfg.max_batch, max_probes=cfg.max_probes,
                                          nodes_per_request=nodes, progress=progress)
    return BatchSearch(found, skipped, nodes)


def run_e2e(cfg: E2EConfig, progress: Callable[[str], None] = lambda _: None) -> dict:
    """The run's JSON document (report.document): sweep, verdicts, largest-batch search."""
    started = time.time()
    progress("building the model")
    bench = build_bench(cfg)
    sweep = run_sweep(cfg, bench, progress)
    judged = verdicts.judge(sweep.results, cfg.batches, bench, cfg.depth)
    if sweep.interrupted:
        search = BatchSearch({}, "skipped (interrupted)", 0)
    else:
        search = search_batches(cfg, bench, judged.comparison, progress)
    data = report.document(cfg, bench, sweep, judged, search, seconds=time.time() - started)
    data["interrupted"] = sweep.interrupted
    bench = None
    free_memory(torch.device(cfg.device))
    return data
