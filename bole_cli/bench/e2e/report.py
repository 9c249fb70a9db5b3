"""The JSON document of a `bole bench e2e` run (`document`, from sweep.run_e2e), and its
tables, notes and plot.

The renderers read only the document, so a results file of an earlier run
(experiments/results/) renders the same way. Terminals narrower than WIDE_COLUMNS get two tables (throughput;
per-step costs and memory) instead of one.
"""

from __future__ import annotations

from typing import Any, Optional

from bole_cli.bench.e2e.decoders import DECODERS, LABELS, PHASES, SHORT_LABELS
from bole_cli.bench.e2e.simulated_acceptance import paper_shape_expected
from bole_cli.memory import format_bytes


def versions() -> dict[str, Optional[str]]:
    import torch

    from bole_cli import __version__

    try:
        import triton

        tv = triton.__version__
    except Exception:  # noqa: BLE001
        tv = None
    return {"bole": __version__, "torch": torch.__version__, "triton": tv,
            "cuda": torch.version.cuda}


def document(cfg: Any, bench: Any, sweep: Any, verdicts: Any, search: Any, seconds: float) -> dict:
    """The run's JSON document: its settings, what ran how, every run (without the token
    traces), the verdicts and the largest-batch search."""
    acc = bench.acceptance
    data = {
        "benchmark": "bole bench e2e",
        "statement": acc.statement(),
        "acceptance": acc.describe(cfg.depth, cfg.topk),
        "costs": "measured (CUDA events per phase, wall clock for tokens/s)" if bench.device.type == "cuda"
                 else "measured on CPU (smoke run: the numbers mean nothing for a GPU)",
        "device": bench.device_name,
        "versions": {**versions(), "sglang": getattr(bench.snapshot.kernels, "version", None)},
        "command": cfg.command,
        "model": cfg.spec.name,
        "dtype": cfg.dtype,
        "context": cfg.context,
        "draft": {"depth": cfg.depth, "topk": cfg.topk, "beam_nodes": bench.layout.n_nodes,
                  "head": "MTP-style: fc + one gated-attention decoder layer + the shared LM head, "
                          "run once per level (its cost is real; its tree shape follows the acceptance model)",
                  "head_bytes": bench.drafter.param_bytes, "draft_vocab": bench.drafter.draft_vocab,
                  "levels": verdicts.drafter_levels},
        "budget_policy": cfg.budget,
        "tree_budgets": list(cfg.tree_budgets),
        "tree_shapes": [list(x) for x in sweep.shapes],
        "prediction": sweep.pricer.describe(),
        "expected_accepted_paper_shape": None if acc.greedy else paper_shape_expected(acc),
        "snapshot_engine": {"engine": bench.snapshot.engine, "description": bench.snapshot_desc},
        "gdn_ops": bench.model.ops.describe(),
        "ar_gdn_decode": bench.model.gdn_decode,
        "kv_read": ("each request's committed keys (flash varlen), one graph bucket for all steps"
                    if bench.model.varlen_attention else
                    "the cache's whole bucket (context + the run's growth) under a mask, one graph bucket "
                    "for all steps; slower than a serving engine's read on a GPU (flash varlen unavailable)"),
        "steps": cfg.steps, "warmup": cfg.warmup, "seed": cfg.seed,
        "results": [r.to_dict() for r in sweep.results],
        "same_acceptance_snapshot_vs_bole": verdicts.same_acceptance,
        "replayssm": sweep.replayssm,
        "chain_depths": list(cfg.chain_depths) if sweep.chains else [],
        "comparison": verdicts.comparison,
        "greedy_exact": verdicts.exact,
        "max_batch": search.found,
        "max_batch_skipped": search.skipped,
        "max_batch_probe": {"nodes_per_request": search.nodes_per_request, "context": cfg.context,
                            "limit": cfg.max_batch, "max_probes": cfg.max_probes,
                            "how": "one eager step per probe (drafter, verify, sample, commit) with the KV cache "
                                   "at the context; fails = a CUDA allocation failure"},
        "weights_bytes": bench.model.param_bytes,
        "seconds": seconds,
    }
    for r in data["results"]:
        r.pop("accept_trace", None)
        r.pop("streams", None)
    return data


def _bytes_cell(n: Optional[int]) -> str:
    return "-" if n is None else format_bytes(n)


def _fmt_max(entry: Optional[dict]) -> str:
    if not entry or entry.get("max_batch") is None:
        return "-" if not entry or "error" not in entry else "error"
    m = entry["max_batch"]
    if entry.get("capped"):
        return f">= {m}"
    return str(m) if entry.get("exact") else f"{m} (< {entry['fails_at']})"


WIDE_COLUMNS = 150  # the one-table layout needs about this many terminal columns

_CAPTION = ("acc. = committed tokens per request and step (bonus included), exp. = the acceptance "
            "model's expectation, N = tree tokens verified per step (whole batch), peak = transient "
            "memory of one step (measured), state = snapshot buffer or Bole's factors, max B = largest "
            "batch that fits, pred. = tokens/s the calibration profile predicts for the run (bole "
            "calibrate's objective, drafting counted)")
_THROUGHPUT = ("tok/s", "pred.", "vs AR", "acc.", "exp.", "N")
_COSTS = PHASES + ("step", "peak", "state")


def _cells(data: dict, r: dict) -> dict:
    """One result row as {column: text}."""
    mb = _fmt_max(data["max_batch"].get(r["decoder"]))
    if r["error"]:
        blank = {c: "-" for c in _THROUGHPUT + _COSTS}
        return {**blank, "tok/s": "OOM" if r["error"] == "out of memory" else "error", "max B": mb}
    ph = r["phase_ms"]
    pred = r.get("predicted_tok_s")
    return {"tok/s": f"{r['tok_s']:.0f}", "pred.": f"{pred:.0f}" if pred else "-",
            "vs AR": f"{r['speedup_vs_ar']:.2f}x" if r["speedup_vs_ar"] else "-",
            "acc.": f"{r['mean_accepted']:.2f}", "exp.": f"{r['expected_accepted']:.2f}",
            "N": str(r["budget"]) if r["budget"] else "-",
            **{p: _ms(ph[p]) for p in PHASES}, "step": _ms(r["step_ms"]),
            "peak": _bytes_cell(r["peak_transient_bytes"]), "state": _bytes_cell(r["verify_state_bytes"]),
            "max B": mb}


def _ms(x: float) -> str:
    """Milliseconds to about four significant figures (1353.69 -> '1354'), so a slow run's
    phases fit the narrow table's columns."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}" if x >= 100 else f"{x:.2f}"


def _one_table(data: dict, title: str, cols: tuple, caption: Optional[str], labels: dict, narrow=False):
    from rich import box
    from rich.table import Table

    from bole_cli.console import add_columns

    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
              box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, pad_edge=not narrow)
    add_columns(t, ("decoder", "B" if narrow else "batch") + cols, text=("decoder",))
    for r in data["results"]:
        cells = _cells(data, r)
        t.add_row(_label(labels, r), str(r["batch"]), *(cells[c] for c in cols))
    return t


def _label(labels: dict, r: dict) -> str:
    shape = r.get("tree_shape")
    return (labels[r["decoder"]] + (f" d{r['chain_depth']}" if r.get("chain_depth") else "")
            + (f" {shape[0]}x{shape[1]}" if shape else ""))


_COMPARE = ("B", "AR", "RSSM", "snap", "Bole", "Bole ch", "wins", "gain", "ceil.")
_COMPARE_CAPTION = ("tokens/s at each decoder's best (chains: best swept depth d); RSSM = SGLang's "
                    "ReplaySSM chain; gain = Bole's best (tree or chain) over the best RSSM chain; "
                    "ceil. = that gain's acceptance ceiling (expected committed tokens, tree over "
                    "chain, at the same depth); * = target missed")


def comparison_table(data: dict):
    """Per batch: AR, the best ReplaySSM chain, the snapshot tree, Bole's tree, Bole's
    chain, the winner and by how much, Bole's realised gain and its ceiling (None when the
    run had no chain decoder)."""
    from rich import box
    from rich.table import Table

    from bole_cli.console import add_columns

    rows = data.get("comparison") or []
    if not any("chain" in row["best"] or "bole-chain" in row["best"] for row in rows):
        return None
    t = Table(title="tree vs chain, end to end", title_justify="left", caption=_COMPARE_CAPTION,
              caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    add_columns(t, _COMPARE, text=("wins",))
    for row in rows:
        best = row["best"]

        def cell(name):
            v = best.get(name)
            if not v:
                return "-"
            return f"{v['tok_s']:.0f}" + (f" d{v['chain_depth']}" if v["chain_depth"] else "")

        wins = "-"
        if row.get("winner"):
            wins = SHORT_LABELS[row["winner"]] + (f" {row['margin']:.2f}x" if row.get("margin") else "")
        gain = "-" if row.get("bole_over_replayssm") is None else (
            f"{row['bole_over_replayssm']:.2f}" + ("" if row.get("target_met") else "*"))
        ceil = "-" if row.get("ceiling") is None else f"{row['ceiling']:.2f}"
        t.add_row(str(row["batch"]), cell("ar"), cell("chain"), cell("snapshot"), cell("bole"),
                  cell("bole-chain"), wins, gain, ceil)
    return t


def tables(data: dict, width: int = WIDE_COLUMNS) -> list:
    """decoder x batch: tokens/s, speedup over AR, accepted tokens (measured, expected),
    budget, per-step split (ms), peak transient memory, verify state buffers, max batch. One
    table when the terminal is wide enough, else throughput and costs as two."""
    title = (f"bole bench e2e: {data['model']} on {data['device']}, context {data['context']}, "
             f"depth {data['draft']['depth']}, top-k {data['draft']['topk']}\n{data['statement']}")
    compare = comparison_table(data)
    extra = [compare] if compare is not None else []
    if width >= WIDE_COLUMNS:
        return [_one_table(data, title + " (times: ms per step)", _THROUGHPUT + _COSTS + ("max B",), _CAPTION,
                           LABELS)] + extra
    return [_one_table(data, title, _THROUGHPUT + ("max B",), None, LABELS, narrow=True),
            _one_table(data, "per step: ms, and memory", _COSTS, _CAPTION, SHORT_LABELS, narrow=True)] + extra


def notes(data: dict) -> list[str]:
    out = [f"snapshot tree verify: {data['snapshot_engine']['description']}"]
    if data.get("kv_read"):
        out.append(f"KV read: {data['kv_read']}")
    if data.get("replayssm"):
        out.append(f"ReplaySSM chain verify: {data['replayssm']}")
    exact = data.get("greedy_exact")
    if exact is not None:
        if exact["identical"]:
            out.append(f"greedy exactness: PASSED - every decoder emitted the same token stream "
                       f"({exact['compared_runs']} runs compared with autoregressive)")
        else:
            out.append("greedy exactness: FAILED - " + "; ".join(exact["mismatches"] + exact["failed"]
                                                                 or ["nothing was compared"]))
    levels = (data.get("draft") or {}).get("levels") or {}
    vocab = data["draft"].get("draft_vocab")
    for b in sorted({x["batch"] for x in levels.get("rows", [])}):
        parts = []
        for kind, pick in (("chain", lambda x: x["levels"] == max(y["levels"] for y in levels["rows"]
                                                                   if y["decoder"] == "chain" and y["batch"] == b)),
                           ("bole", lambda x: True)):
            x = next((x for x in levels["rows"] if x["decoder"] == kind and x["batch"] == b and pick(x)), None)
            if x:
                parts.append(f"{SHORT_LABELS[kind]} {x['ms_per_level']:.2f} ms (floor {x['floor_ms']:.2f}, "
                             f"{x['over_floor']:.1f}x)")
        if parts:
            out.append(f"drafter per level at batch {b}, vocabulary {vocab}: " + "; ".join(parts))
    for row in data.get("comparison") or []:
        if row.get("bole_over_replayssm") is None:
            continue
        verdict = "target met" if row["target_met"] else "TARGET MISSED"
        out.append(f"batch {row['batch']}: Bole's best over the best ReplaySSM chain {row['bole_over_replayssm']:.2f}x, "
                   f"ceiling {row['ceiling']:.2f}x ({verdict})")
    budgets: dict[int, list[str]] = {}
    for r in data["results"]:
        if r["budget_source"] and not r.get("chain_depth"):
            seen = budgets.setdefault(r["batch"], [])
            if r["budget_source"] not in seen:  # every budget a --tree-budgets sweep ran
                seen.append(r["budget_source"])
    for b, sources in budgets.items():
        out.append(f"budget{'s' if len(sources) > 1 else ''} at batch {b}: {'; '.join(sources)}")
    mb = data["max_batch_probe"]
    if data.get("max_batch_skipped"):
        out.append(f"largest-batch search {data['max_batch_skipped']}")
    elif data["max_batch"]:
        out.append(f"max batch: binary search up to {mb['limit']} ({mb['max_probes']} probes at most), context "
                   f"{mb['context']}, tree decoders verifying {mb['nodes_per_request']} nodes per request")
    for r in data["results"]:
        if r["error"]:
            out.append(f"{_label(LABELS, r)} at batch {r['batch']} failed: {r['error']}")
    for name, mb in data["max_batch"].items():
        if mb.get("error"):
            out.append(f"largest-batch search of {LABELS[name]} stopped: {mb['error']}")
    for b, same in data["same_acceptance_snapshot_vs_bole"].items():
        if not same:
            out.append(f"WARNING: the two tree decoders accepted different nodes at batch {b}")
    return out


def plot(data: dict, path) -> None:
    """Throughput against batch size (left) and speedup over autoregressive (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bole_cli.console import save_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    batches = sorted({r["batch"] for r in data["results"]})
    for name in DECODERS:
        rows = [r for r in data["results"] if r["decoder"] == name and r["tok_s"]]
        if rows and rows[0].get("chain_depth"):  # chains: the best swept depth per batch
            rows = [max((r for r in rows if r["batch"] == b), key=lambda r: r["tok_s"])
                    for b in sorted({r["batch"] for r in rows})]
        if not rows:
            continue
        label = LABELS[name]
        mb = data["max_batch"].get(name)
        if mb and mb.get("max_batch") is not None:
            label += f" (max batch {_fmt_max(mb)})"
        line, = ax.plot([r["batch"] for r in rows], [r["tok_s"] for r in rows], "o-", label=label)
        sp = [r for r in rows if r["speedup_vs_ar"]]
        if sp and name != "ar":
            bx.plot([r["batch"] for r in sp], [r["speedup_vs_ar"] for r in sp], "o-", color=line.get_color(),
                    label=LABELS[name])
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(batches, [str(b) for b in batches])
        a.set_xlabel("batch size")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s")
    bx.axhline(1.0, color="grey", lw=0.8, ls="--")
    bx.set_ylabel("speedup over autoregressive")
    ax.legend(fontsize=8)
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=8)
    mode = "acceptance simulated" if data["acceptance"]["mode"] == "simulated" else "greedy acceptance"
    fig.suptitle(f"{data['model']} on {data['device']}, context {data['context']}, depth {data['draft']['depth']}, "
                 f"top-k {data['draft']['topk']} ({mode} [{data['acceptance']['name']}], costs measured)", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)
