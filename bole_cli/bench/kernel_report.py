"""The JSON document, tables, notes and plot of `bole bench kernels` (bole_cli/bench/kernel_bench.py).

One GDN layer's tree verify + commit, SGLang 0.5.23 against Bole, per (tree, batch, nodes),
with the memory-traffic floor (docs/design.md §3). Terminals narrower than WIDE_COLUMNS get
two tables (times; floor, bytes and agreement) instead of one. Chains add a table against
SGLang's ReplaySSM as a GDN model runs it (the circular ring: verify + commit in steady
state), with the fold protocol (KDA's) as a second baseline, one of Bole's deferred write
against the ring (bench/deferred_write.py), and the "tree vs chain at equal verify time"
view: per batch, the largest measured Bole tree that costs no more than ReplaySSM's chain
of EQUAL_TIME_CHAIN tokens.
"""

from __future__ import annotations

from pathlib import Path

from bole_cli.bench.kernel_bench import KernelBenchResult, KernelCase, geomean
from bole_cli.memory import format_bytes

KERNEL_TIMES = ("SGLang us", "Bole us", "verify us", "commit us", "speedup")
KERNEL_BYTES = ("floor us", "% floor", "snapshots", "factors", "o diff")
WIDE_COLUMNS = 140  # the one-table layout needs about this many terminal columns
# The headline: random trees at the batches and sizes SGLang serves most.
GEOMEAN_KEY = "geomean_speedup_b1_4_16_n16_32_64"
REPLAYSSM_COLUMNS = ("RSSM", "verify", "commit", "fold", "Bole", "Bole/RSSM", "o diff", "S diff")
DEFERRED_COLUMNS = ("width", "RSSM", "deferred", "verify", "commit", "def/RSSM", "o diff", "S diff")
EQUAL_TIME_CHAIN = 8  # SGLang's usual draft window


def equal_time_view(cases) -> list[dict]:
    """Per batch: ReplaySSM's chain of EQUAL_TIME_CHAIN tokens and the largest measured
    random Bole tree whose verify + commit costs no more (None when none does); batches
    without both a chain of that length and random trees in the run are left out."""
    out = []
    for batch in sorted({c.batch for c in cases}):
        chain = next((c for c in cases if c.tree == "chain" and c.batch == batch
                      and c.nodes == EQUAL_TIME_CHAIN and c.replayssm_us), None)
        trees = [c for c in cases if c.tree == "random" and c.batch == batch and c.bole_us]
        if chain is None or not trees:
            continue
        fits = [c for c in trees if c.bole_us <= chain.replayssm_us]
        best = max(fits, key=lambda c: c.nodes, default=None)
        out.append({"batch": batch, "replayssm_chain_nodes": EQUAL_TIME_CHAIN,
                    "replayssm_us": chain.replayssm_us, "bole_chain_us": chain.bole_us,
                    "largest_tree_nodes": best.nodes if best else None,
                    "tree_us": best.bole_us if best else None})
    return out


def kernel_document(result: KernelBenchResult, *, dtype: str, state_dtype: str, command: str,
                    seconds: float, precision: str = "auto") -> dict:
    """The results as JSON data, with a summary: the headline geometric-mean speedup, the
    command line, the run time, the dtypes and the verify's dot precision."""
    data = result.to_dict()
    core = [c.speedup for c in result.cases if c.tree == "random" and c.batch in (1, 4, 16) and c.nodes in (16, 32, 64)]
    ratios = [c.bole_over_replayssm for c in result.cases if c.bole_over_replayssm]
    folds = [c.bole_us / c.fold_us for c in result.cases if c.fold_us and c.bole_us]
    served = [c.bole_us / c.factors_us for c in result.cases if c.factors_us and c.bole_us]
    deferred = [c.deferred_over_replayssm for c in result.cases if c.deferred_over_replayssm]
    data["summary"] = {GEOMEAN_KEY: geomean(core), "command": command, "seconds": seconds,
                       "dtype": dtype, "state_dtype": state_dtype, "precision": precision,
                       "bole_over_replayssm_max": max(ratios) if ratios else None,
                       "bole_over_replayssm_geomean": geomean(ratios),
                       "replayssm_protocol": "circular ring (GDN)" if ratios else None,
                       "bole_over_kda_fold_geomean": geomean(folds),
                       # Bole's deferred write (bench/deferred_write.py) over the ring
                       "deferred_over_replayssm_max": max(deferred) if deferred else None,
                       "deferred_over_replayssm_geomean": geomean(deferred),
                       # the served path (replay commit) over the factorised path served before
                       "served_over_factors_max": max(served) if served else None,
                       "served_over_factors_geomean": geomean(served),
                       "equal_time": equal_time_view(result.cases),
                       "agree": not result.disagreements}
    return data


def kernel_cells(c: KernelCase) -> dict:
    """One case as {column: text}."""
    d = c.to_dict()
    return {"SGLang us": f"{c.sglang_us:.1f}" if c.sglang_us else "-", "Bole us": f"{c.bole_us:.1f}",
            "verify us": f"{c.bole_verify_us:.1f}", "commit us": f"{c.bole_commit_us:.1f}",
            "speedup": f"{c.speedup:.1f}x" if c.speedup else "-", "floor us": f"{c.floor_us:.1f}",
            "% floor": f"{d['pct_of_floor']:.0f}%", "snapshots": format_bytes(c.sglang_transient_bytes),
            "factors": format_bytes(c.bole_transient_bytes),
            "o diff": f"{c.max_rel_diff_o:.1e}" if c.max_rel_diff_o is not None else "-"}


def tables(result, width: int = WIDE_COLUMNS) -> list:
    """Times, floor, transient bytes and agreement per case: one table on a wide terminal,
    else times and the rest as two that fit. `result` needs model, device, copy_bandwidth
    and cases (a KernelBenchResult, or the same read back from a results file)."""
    from rich import box
    from rich.table import Table

    from bole_cli.console import add_columns

    title = (f"One GDN layer, {result.model} shape, {result.device} "
             f"(copy bandwidth {result.copy_bandwidth / 1e12:.2f} TB/s)")
    narrow = width < WIDE_COLUMNS
    groups = [KERNEL_TIMES, KERNEL_BYTES] if narrow else [KERNEL_TIMES + KERNEL_BYTES]
    out = []
    for i, cols in enumerate(groups):
        t = Table(title=title if i == 0 else "floor, transient bytes per layer, o diff = relative difference from SGLang",
                  title_justify="left", box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, pad_edge=not narrow)
        if not narrow:
            t.caption = "o diff = relative difference of o from SGLang's; floor = bytes / copy bandwidth"
        add_columns(t, ("tree", "batch", "nodes") + cols, text=("tree",))
        for c in result.cases:
            cells = kernel_cells(c)
            t.add_row(c.tree, str(c.batch), str(c.nodes), *(cells[k] for k in cols))
        out.append(t)

    def us(x):
        return f"{x:.1f}" if x else "-"

    def ratio(x):
        return f"{x:.2f}" if x else "-"

    def ring_row(c):
        return (us(c.replayssm_us), us(c.replayssm_verify_us), us(c.replayssm_commit_us), us(c.fold_us),
                us(c.bole_us), ratio(c.bole_over_replayssm), f"{c.replayssm_diff_o:.0e}",
                f"{c.replayssm_diff_state:.0e}")

    def deferred_row(c):
        return (str(c.deferred_width or "-"), us(c.replayssm_us), us(c.deferred_us), us(c.deferred_verify_us),
                us(c.deferred_commit_us), ratio(c.deferred_over_replayssm), f"{c.deferred_diff_o:.0e}",
                f"{c.deferred_diff_state:.0e}")

    chain_tables = (
        ("chains: ReplaySSM ring (GDN's protocol) vs Bole, verify + commit, us",
         "RSSM = SGLang's ReplaySSM ring, steady state; fold = its KDA protocol (verify + fold); "
         "o / S diff: the ring vs Bole's o and committed state", REPLAYSSM_COLUMNS, "replayssm_us", ring_row),
        ("chains: Bole's deferred write vs the ReplaySSM ring, verify + commit, us",
         "width = rows a request's segment holds (the ring's length); both in steady state; "
         "o / S diff: against Bole's served step", DEFERRED_COLUMNS, "deferred_us", deferred_row))
    for title, caption, columns, timed, row in chain_tables:
        cases = [c for c in result.cases if getattr(c, timed)]
        if not cases:
            continue
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  caption=caption)
        for col in ("B", "nodes") + columns:
            t.add_column(col, justify="right", no_wrap=True)
        for c in cases:
            t.add_row(str(c.batch), str(c.nodes), *row(c))
        out.append(t)
    return out


def notes(result: KernelBenchResult, data: dict) -> list[str]:
    """The lines under the tables: the all-layer commits, then the headline speedup."""
    out = []
    for c in result.commits:
        sg = f", SGLang copy-back {c.sglang_copy_us:.0f} us" if c.sglang_copy_us else ""
        out.append(f"commit of all {c.layers} GDN layers at batch {c.batch}: Bole {c.bole_us:.0f} us in one launch, "
                   f"floor {c.floor_us:.0f} us ({format_bytes(c.floor_bytes)}){sg}")
    summary = data["summary"]
    if summary.get("bole_over_replayssm_max"):
        worst = summary["bole_over_replayssm_max"]
        verdict = "Bole no slower at every chain cell" if worst <= 1.0 else "Bole SLOWER at some chain cells"
        out.append(f"chains, Bole / ReplaySSM ring time: worst {worst:.2f}, geometric mean "
                   f"{summary['bole_over_replayssm_geomean']:.2f} ({verdict})")
        if summary.get("deferred_over_replayssm_max"):
            worst = summary["deferred_over_replayssm_max"]
            verdict = "no slower at every cell" if worst <= 1.0 else "SLOWER at some cells"
            out.append(f"chains, Bole's deferred write / ReplaySSM ring time: worst {worst:.2f}, geometric "
                       f"mean {summary['deferred_over_replayssm_geomean']:.2f} ({verdict})")
        by_len: dict[int, set] = {}
        for c in result.cases:
            if c.replayssm_cache_len:
                by_len.setdefault(c.replayssm_cache_len, set()).add(c.nodes)
        if by_len:
            out.append("ReplaySSM ring length (--linear-replayssm-cache-len): " + "; ".join(
                f"{n} for chains of {', '.join(map(str, sorted(nodes)))}" for n, nodes in sorted(by_len.items())))
    for row in summary.get("equal_time") or []:
        tree = (f"Bole's largest tree within it: {row['largest_tree_nodes']} nodes ({row['tree_us']:.1f} us)"
                if row["largest_tree_nodes"] else "no measured Bole tree fits")
        out.append(f"batch {row['batch']}: ReplaySSM chain of {row['replayssm_chain_nodes']} "
                   f"{row['replayssm_us']:.1f} us; {tree}")
    for line in (result.notes if hasattr(result, "notes") else data.get("notes", [])):
        if line.startswith(("ReplaySSM did not run", "the deferred write did not run")):
            out.append(line)
    for line in result.disagreements if hasattr(result, "disagreements") else data.get("disagreements", []):
        out.append(f"DISAGREEMENT {line}")
    if data["summary"][GEOMEAN_KEY]:
        out.append(f"geometric-mean speedup (random trees, batch 1/4/16 x nodes 16/32/64): "
                   f"{data['summary'][GEOMEAN_KEY]:.1f}x")
    return out


def plot(result, path: Path) -> None:
    """Verify + commit time against tree size, one panel per tree kind, with the floor dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bole_cli.console import save_figure

    trees = sorted({c.tree for c in result.cases})
    if not trees:  # interrupted before its first cell: no picture
        return
    fig, axes = plt.subplots(1, len(trees), figsize=(6 * len(trees), 4.2), squeeze=False)
    for ax, tree in zip(axes[0], trees):
        for batch in sorted({c.batch for c in result.cases}):
            cs = [c for c in result.cases if c.tree == tree and c.batch == batch]
            xs = [c.nodes for c in cs]
            line, = ax.plot(xs, [c.bole_us for c in cs], "o-", label=f"Bole B={batch}")
            if any(c.sglang_us for c in cs):
                ax.plot(xs, [c.sglang_us for c in cs], "s--", color=line.get_color(), alpha=0.6,
                        label=f"SGLang B={batch}")
            ax.plot(xs, [c.floor_us for c in cs], ":", color=line.get_color(), alpha=0.4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tree nodes per request")
        ax.set_ylabel("microseconds (verify + commit)")
        ax.set_title(f"{tree} trees (dotted: memory floor)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{result.model} GDN layer on {result.device}")
    save_figure(fig, path)
    plt.close(fig)
