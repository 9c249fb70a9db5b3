"""The tables, notes and plot of `bole bench e2e`, from its JSON document (harness.run_e2e).

They read only the document, so a results file of an earlier run (experiments/results/)
renders the same way. Terminals narrower than WIDE_COLUMNS get two tables (throughput;
per-step costs and memory) instead of one.
"""

from __future__ import annotations

from typing import Optional

from bole_cli.bench.e2e.decoders import DECODERS, LABELS, PHASES, SHORT_LABELS
from bole_cli.memory import format_bytes


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
            "batch that fits")
_THROUGHPUT = ("tok/s", "vs AR", "acc.", "exp.", "N")
_COSTS = PHASES + ("step", "peak", "state")


def _cells(data: dict, r: dict) -> dict:
    """One result row as {column: text}."""
    mb = _fmt_max(data["max_batch"].get(r["decoder"]))
    if r["error"]:
        blank = {c: "-" for c in _THROUGHPUT + _COSTS}
        return {**blank, "tok/s": "OOM" if r["error"] == "out of memory" else "error", "max B": mb}
    ph = r["phase_ms"]
    return {"tok/s": f"{r['tok_s']:.0f}",
            "vs AR": f"{r['speedup_vs_ar']:.2f}x" if r["speedup_vs_ar"] else "-",
            "acc.": f"{r['mean_accepted']:.2f}", "exp.": f"{r['expected_accepted']:.2f}",
            "N": str(r["budget"]) if r["budget"] else "-",
            **{p: f"{ph[p]:.2f}" for p in PHASES}, "step": f"{r['step_ms']:.2f}",
            "peak": _bytes_cell(r["peak_transient_bytes"]), "state": _bytes_cell(r["verify_state_bytes"]),
            "max B": mb}


def _one_table(data: dict, title: str, cols: tuple, caption: Optional[str], labels: dict, narrow=False):
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", caption=caption, box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
              pad_edge=not narrow)
    for c in ("decoder", "B" if narrow else "batch") + cols:
        t.add_column(c, justify="left" if c == "decoder" else "right", no_wrap=True)
    for r in data["results"]:
        cells = _cells(data, r)
        t.add_row(labels[r["decoder"]], str(r["batch"]), *(cells[c] for c in cols))
    return t


def tables(data: dict, width: int = WIDE_COLUMNS) -> list:
    """decoder x batch: tokens/s, speedup over AR, accepted tokens (measured, expected),
    budget, per-step split (ms), peak transient memory, verify state buffers, max batch. One
    table when the terminal is wide enough, else throughput and costs as two."""
    title = (f"bole bench e2e: {data['model']} on {data['device']}, context {data['context']}, "
             f"depth {data['draft']['depth']}, top-k {data['draft']['topk']}\n{data['statement']}")
    if width >= WIDE_COLUMNS:
        return [_one_table(data, title + " (times: ms per step)", _THROUGHPUT + _COSTS + ("max B",), _CAPTION,
                           LABELS)]
    return [_one_table(data, title, _THROUGHPUT + ("max B",), None, LABELS, narrow=True),
            _one_table(data, "per step: ms, and memory", _COSTS, _CAPTION, SHORT_LABELS, narrow=True)]


def notes(data: dict) -> list[str]:
    out = [f"snapshot tree verify: {data['snapshot_engine']['description']}"]
    budgets = {}
    for r in data["results"]:
        if r["budget_source"]:
            budgets[r["batch"]] = r["budget_source"]
    for b, src in budgets.items():
        out.append(f"budget at batch {b}: {src}")
    mb = data["max_batch_probe"]
    if data["max_batch"]:
        out.append(f"max batch: binary search up to {mb['limit']} ({mb['max_probes']} probes at most), context "
                   f"{mb['context']}, tree decoders verifying {mb['nodes_per_request']} nodes per request")
    for r in data["results"]:
        if r["error"]:
            out.append(f"{LABELS[r['decoder']]} at batch {r['batch']} failed: {r['error']}")
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
