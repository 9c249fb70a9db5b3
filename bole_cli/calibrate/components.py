"""The roofline's H200 efficiency factors (costmodel.EFFICIENCY["h200"]) from the component
microbenchmarks that measured them, so the numbers in the code can be re-derived from the
committed records (experiments/README.md rows R-*):

- `experiments/component_bench.py`'s JSON: GEMMs at a model's projection shapes against
  rows (weight streaming, weighted by how often one decode step streams each shape; GEMM
  rate), the runtime's small kernels at decode rows (the per-kernel floor), the fused GDN
  decode by batch and the attention over the KV cache by keys and query rows (their shares
  of their rooflines' speed);
- `experiments/runtime_step_bench.py`'s JSONs: a step's graph replay against the sum and
  count of its kernels (the gap per launch, the launches per layer of a decode and of a
  verify step) and the serving step against the bare replay (the host's share of a step);
- `bole bench kernels`' JSON at the served default: one GDN layer's tree verify + commit
  against the roofline's price of it (the tree kernels' share of their roofline's speed).

Nothing here reads a profile or an end-to-end result: the factors are never fitted to what
they predict.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from bole_cli.limits import SKINNY_DEFAULT_MAX_ROWS, gdn_decode_launch, gdn_decode_warps

DATASHEET_BANDWIDTH = 4.8e12  # H200, bole_cli.catalog.hardware
STREAMING_ROWS = 64  # weight streaming: GEMMs up to this many rows
COMPUTE_ROWS = 1024  # GEMM rate: from this many rows
PRODUCTION = "production"  # runtime_step_bench's name for the runtime as calibrate runs it
CUBLAS = "cublas"  # ... and for it with every projection through cuBLAS
# The committed records costmodel.EFFICIENCY["h200"] comes from, under experiments/results/
# (`factors`' three arguments); experiments/derive_factors.py prints the factors of these or
# of newer records, and a test holds the code to these.
H200_RECORDS = {"components": "components/h200-9b-r14.json", "steps": ("runtime/r15/steps-h200.json",),
                "tree_kernels": "components/h200-9b-gdn-grid.json"}
# what `factors` returns, in its order (Efficiency's and RuntimeLaunches' fields of those names)
FACTOR_NAMES = ("bw", "flops", "kernel_floor_s", "host_step_s", "gdn_tree_cells", "gdn_decode_cells",
                "attention_cells", "draft_attention_cells", "gemm_knee", "gap_s", "decode_launches_per_layer",
                "rows_decode_launches_per_layer", "verify_launches_per_layer", "decode_host_s", "verify_host_s")


def _bare_roofline(model: str, **cleared):
    """(spec, the H200's RooflineForward for `model`) with the factor being derived cleared,
    so a share is priced against the roofline it scales."""
    import dataclasses

    from bole_cli.calibrate.costmodel import EFFICIENCY, RooflineForward
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.catalog.models import resolve_model

    spec = resolve_model(model)
    return spec, RooflineForward(spec, resolve_gpu("h200"), dataclasses.replace(EFFICIENCY["h200"], **cleared))


def gdn_tree_cells(tree_kernels: Mapping[str, Any]) -> tuple[tuple[float, float, float], ...]:
    """(batch, nodes a request, share) for each random-tree cell of the record: the
    roofline's GDN verify + commit (the conv left out, as the bench times the kernels alone)
    over the measured time, rounded to 3 digits."""
    from bole_cli.calibrate.costmodel import Cost

    spec, roof = _bare_roofline(tree_kernels["model"], gdn_tree_cells=())
    cells = []
    for c in sorted(tree_kernels["cases"], key=lambda c: (c["batch"], c["nodes"])):
        if c["tree"] != "random" or c.get("bole_us") is None:
            continue
        b, n = c["batch"], c["nodes"]
        conv = roof._time(Cost(b * spec.conv_dim * (spec.conv_kernel - 1) * 2 * 2, 0.0))
        core = roof.components(b, 4096, b * n, verify=True)["gdn_core"] / spec.n_gdn_layers - conv
        cells.append((float(b), float(n), round(core / (c["bole_us"] * 1e-6), 3)))
    return tuple(cells)


def _decode_launch(row: Mapping[str, Any]) -> tuple[int, int] | None:
    """(value split, warps) of a record's fused GDN decode row; rows without a split are of
    one program a head, rows without warps of the default for their split; None for a row of
    another impl (SGLang's) or of an experimental variant of the kernel (its "variant")."""
    if row.get("impl", "bole") != "bole" or row.get("variant"):
        return None
    split = row.get("value_split", 1)
    return split, row.get("num_warps", gdn_decode_warps(split))


def gdn_decode_cells(components: Mapping[str, Any]) -> tuple[tuple[float, float], ...]:
    """(batch, share) for each batch of the record's fused GDN decode rows at the runtime's
    launch (limits.gdn_decode_launch): the roofline's price of a decode's GDN layer (state
    read and written, conv window, its inputs and output) over the measured time, rounded to
    3 digits; () when the record has none."""
    spec, roof = _bare_roofline(components["model"], gdn_decode_cells=())
    rows = [r for r in components.get("gdn_decode", ())
            if _decode_launch(r) == gdn_decode_launch(r["batch"] * spec.gdn_value_heads)]
    cells = []
    for row in sorted(rows, key=lambda r: r["batch"]):
        b = row["batch"]
        layer = roof.components(b, 4096, b, verify=False)["gdn_core"] / spec.n_gdn_layers
        cells.append((float(b), round(layer / (row["us"] * 1e-6), 3)))
    return tuple(cells)


DECODE_LAUNCH_TIE = 0.01  # a launch within 1% of the fastest is a tie (timing noise between calls)


def gdn_decode_launch_rows(records: Sequence[Mapping[str, Any]]) -> tuple[tuple[int | None, int, int], ...]:
    """limits.GDN_DECODE_LAUNCH from component records' fused GDN decode rows (ours, each
    launch by batch): at each measured head count (batch x the record's value heads) the
    launch of the lowest median over the records that time it, unless the launch of the
    count below ties with it (within DECODE_LAUNCH_TIE: the rule keeps it rather than step
    on noise); between two measured counts the lower one's launch up to their geometric
    mean; neighbours with the same launch merged, the last row open (None). Give one device's
    records: a median over two devices mixes their speeds."""
    import math

    from bole_cli.catalog.models import resolve_model

    times: dict[int, dict[tuple[int, int], list[float]]] = {}
    for rec in records:
        hv = resolve_model(rec["model"]).gdn_value_heads
        for row in rec.get("gdn_decode", ()):
            launch = _decode_launch(row)
            if launch is not None:
                times.setdefault(row["batch"] * hv, {}).setdefault(launch, []).append(row["us"])
    counts = sorted(times)
    rows: list[tuple[int | None, int, int]] = []
    for i, heads in enumerate(counts):
        limit = math.isqrt(heads * counts[i + 1]) if i + 1 < len(counts) else None
        medians = {ln: statistics.median(us) for ln, us in times[heads].items()}
        launch = min(medians, key=lambda ln: (medians[ln], ln))
        below = rows[-1][1:] if rows else None
        if below in medians and medians[below] <= medians[launch] * (1 + DECODE_LAUNCH_TIE):
            launch = below
        if rows and rows[-1][1:] == launch:
            rows[-1] = (limit, *launch)
        else:
            rows.append((limit, *launch))
    return tuple(rows)


def attention_cells(components: Mapping[str, Any], *, drafter: bool = False
                    ) -> tuple[tuple[float, float, float], ...]:
    """(keys a layer reads = batch x cache length, query rows a (request, KV head) = tokens x
    the GQA group, share) for the record's attention rows: the roofline's price of one
    full-attention layer's attention (the cache read, the tree's rows) over the measured
    time, the median over the (batch, cache length) pairs that read as many keys, rounded to
    3 digits; () when the record has none. Rows, not tokens, because the kernel tiles rows:
    one model's cells then price another's group (experiments/NOTES.md "27B's attention
    reads its keys two or three times"). The
    target's cells from its decode and tree rows; with `drafter`, the drafter level's from
    its own rows (no tree mask, priced as draft_components prices them) and the decode rows
    (its one-row level is the same call), () without drafter rows. Rows of a sweep's launches
    or variants (component_bench.py --attention-launches, --attention-variants) are left out:
    they are not the runtime's call."""
    spec, roof = _bare_roofline(components["model"], attention_cells=(), draft_attention_cells=())
    rows = list(components.get("attention", ()))
    forms = ("decode", "drafter") if drafter else ("decode", "tree")
    if drafter and not any(row.get("form") == "drafter" for row in rows):
        return ()
    shares: dict[tuple[int, int], list[float]] = {}
    for row in rows:
        b, kv, n = row["batch"], row["kv"], row["tokens"]
        if row.get("form", "decode" if n == 1 else "tree") not in forms or "launch" in row or "variant" in row:
            continue  # another form, or a launch or variant of a sweep, not the runtime's own
        if drafter:
            layer = roof.draft_components(b, kv, n)["attention"]
        else:
            layer = roof.components(b, kv, b * n, verify=n > 1)["attention"] / spec.n_attention_layers
        shares.setdefault((b * kv, n * spec.attn_group), []).append(layer / (row["us"] * 1e-6))
    return tuple((float(keys), float(q_rows), round(statistics.median(v), 3))
                 for (keys, q_rows), v in sorted(shares.items()))


def gemm_knee(components: Mapping[str, Any], bw: float, flops: float,
              bandwidth: float, peak_flops: float) -> tuple[tuple[float, float], ...]:
    """(x, y) for each row count of the record: x = a GEMM's compute time at the measured
    rate over its weights' streaming time at the measured bandwidth, y = its measured time
    over the larger of its own one-row time scaled by bytes (streaming) and its compute
    time; the median over the record's shapes, rounded to 3 digits."""
    by_shape: dict[str, list[Mapping[str, Any]]] = {}
    for g in components["gemms"]:
        by_shape.setdefault(g["gemm"], []).append(g)
    by_rows: dict[int, list[tuple[float, float]]] = {}
    for rows in by_shape.values():
        one = min(rows, key=lambda g: g["M"])
        for g in rows:
            weights = g["N"] * g["K"] * 2
            compute = 2.0 * g["M"] * g["N"] * g["K"] / (peak_flops * flops)
            stream = one["us"] * 1e-6 * g["bytes"] / one["bytes"]
            by_rows.setdefault(g["M"], []).append(
                (compute / (weights / (bandwidth * bw)), g["us"] * 1e-6 / max(stream, compute)))
    return tuple((round(statistics.median(x for x, _ in v), 4), round(statistics.median(y for _, y in v), 3))
                 for _, v in sorted(by_rows.items()))


def factors(components: Mapping[str, Any], steps: Sequence[Mapping[str, Any]],
            tree_kernels: Mapping[str, Any], peak_flops: float) -> dict[str, float]:
    """Efficiency's bw, flops, kernel_floor_s, host_step_s, gdn_tree_cells, gdn_decode_cells,
    attention_cells, draft_attention_cells, gemm_knee and its RuntimeLaunches fields."""
    from bole_cli.catalog.models import resolve_model

    spec = resolve_model(components["model"])
    per_step = {"gdn_in_proj": spec.n_gdn_layers, "mlp_gate_up": spec.layers, "mlp_down": spec.layers,
                "lm_head": 1}  # how often one decode step streams each shape
    stream = [g for g in components["gemms"] if g["M"] <= STREAMING_ROWS]
    moved = sum(per_step[g["gemm"]] * g["bytes"] for g in stream)
    bw = moved / sum(per_step[g["gemm"]] * g["us"] * 1e-6 for g in stream) / DATASHEET_BANDWIDTH
    flops = statistics.mean(2.0 * g["M"] * g["N"] * g["K"] / (g["us"] * 1e-6) / peak_flops
                            for g in components["gemms"] if g["M"] >= COMPUTE_ROWS)
    floor = statistics.median(k["us"] for k in components["small_kernels"]
                              if k["kernel"] == "add_rms" and k["rows"] == 1) * 1e-6
    gaps, launches, host = [], {"decode": [], "verify": [], "rows": [], "cublas": []}, {"decode": [], "verify": []}
    for doc in steps:
        for p in (p for p in doc["profile"] if p["variant"] == CUBLAS and p["step"] == "decode"):
            launches["cublas"].append(p["kernels"] / resolve_model(p["model"]).layers)
        for p in (p for p in doc["profile"] if p["variant"] == PRODUCTION):
            per_layer = p["kernels"] / resolve_model(p["model"]).layers
            launches["rows" if p["step"] == "decode" and p["batch"] > SKINNY_DEFAULT_MAX_ROWS else p["step"]].append(
                per_layer)
            # the gap per launch from every profiled decode, one row or more (graph replay less
            # the kernels' sum, over their count)
            replay = [d["replay_ms"] for d in doc["decode"] if p["step"] == "decode"
                      and (d["model"], d["variant"], d["batch"]) == (p["model"], p["variant"], p["batch"])]
            if replay:
                gaps.append((replay[0] - p["kernel_ms"]) * 1e-3 / p["kernels"])
        for step in host:  # the serving step's host share: serving - replay of the same step
            host[step] += [(r["serving_ms"] - r["replay_ms"]) * 1e-3 for r in doc[step]
                           if r["variant"] == PRODUCTION]
    return {"bw": bw, "flops": flops, "kernel_floor_s": floor,
            "host_step_s": components["host_step"]["us_median"] * 1e-6,
            "gdn_tree_cells": gdn_tree_cells(tree_kernels), "gdn_decode_cells": gdn_decode_cells(components),
            "attention_cells": attention_cells(components),
            "draft_attention_cells": attention_cells(components, drafter=True),
            "gemm_knee": gemm_knee(components, bw, flops, DATASHEET_BANDWIDTH, peak_flops),
            "gap_s": statistics.median(gaps),
            "decode_launches_per_layer": statistics.median(launches["decode"]),
            # a decode of more rows as profiled, else the one-row step without its skinny
            # projections (the same launches from two rows on, limits.SKINNY_DEFAULT_MAX_ROWS),
            # else the one-row count
            "rows_decode_launches_per_layer": statistics.median(launches["rows"] or launches["cublas"]
                                                                or launches["decode"]),
            "verify_launches_per_layer": statistics.median(launches["verify"]),
            "decode_host_s": statistics.median(host["decode"]),
            "verify_host_s": statistics.median(host["verify"])}


def code_factors() -> dict[str, Any]:
    """The factors as costmodel.EFFICIENCY["h200"] holds them (the one GPU whose factors are
    measured), by `factors`' names."""
    import dataclasses

    from bole_cli.calibrate.costmodel import EFFICIENCY

    eff = EFFICIENCY["h200"]
    held = {**dataclasses.asdict(eff.runtime), **dataclasses.asdict(eff)}
    return {name: held[name] for name in FACTOR_NAMES}
