"""The roofline's H200 efficiency factors (costmodel.H200_MEASURED) from the component
microbenchmarks that measured them, so the numbers in the code can be re-derived from the
committed records (experiments/README.md rows R-*):

- `experiments/component_bench.py`'s JSON: GEMMs at a model's projection shapes against
  rows (weight streaming, weighted by how often one decode step streams each shape; GEMM
  rate), the runtime's small kernels at decode rows, the host
  step;
- `experiments/runtime_step_bench.py`'s JSON: a decode step's graph replay against the sum
  of its kernels (the replay's gap per kernel).

Nothing here reads a profile or an end-to-end result: the factors are never fitted to what
they predict.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

DATASHEET_BANDWIDTH = 4.8e12  # H200, bole_cli.catalog.hardware
STREAMING_ROWS = 64  # weight streaming: GEMMs up to this many rows
COMPUTE_ROWS = 1024  # GEMM rate: from this many rows


def factors(components: Mapping[str, Any], steps: Mapping[str, Any], peak_flops: float) -> dict[str, float]:
    """bw, flops, kernel_floor_s, gap_s, host_step_s (see costmodel.EFFICIENCY)."""
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
    gaps = []
    for p in steps["profile"]:
        replay = [d["replay_ms"] for d in steps["decode"]
                  if (d["model"], d["variant"], d["batch"]) == (p["model"], p["variant"], p["batch"])]
        if replay and p["variant"] == "production":
            gaps.append((replay[0] - p["kernel_ms"]) * 1e-3 / p["kernels"])
    return {"bw": bw, "flops": flops, "kernel_floor_s": floor, "gap_s": statistics.median(gaps),
            "host_step_s": components["host_step"]["us_median"] * 1e-6}
