"""Calibration: the verify budget of docs/design.md §4 for one (gpu, model).

- sweep: the `StepTimer` protocol a runtime implements, the timing driver (warm-up,
  median of repeats, noise guard, Ctrl-C keeps what was measured), profile building;
- costmodel: `RooflineForward`, the same protocol answered by a roofline model
  (estimated profiles), and the per-GPU efficiency factors;
- decision: how to speculate, drafting counted (no speculation, a chain, a tree);
- selection: Eq. 12 (`select_b_ver`), the paper's rule beside the decision;
- measured: the GPU StepTimer's drafter and sampling timings;
- acceptance: expected committed tokens per tree budget (paper presets, files);
- observed: the acceptance model fitted to a serving engine's accepted-length histogram
  (its file: histogram_file; the family's maximum-likelihood fit: family_fit; the shared
  rank rule: ranks);
- plot: the T_ver / T_dec figure;
- summary: the rows of the summary table `bole calibrate` prints;
- pipeline: `bole calibrate` in order (check, choose measured or estimated, sweep, write,
  plot).
Nothing here imports torch; the measured path imports bole_cli.runtime only when used.
Names are loaded on first use so that `bole --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DEFAULT_BATCHES": "defaults", "DEFAULT_EPS": "defaults", "DEFAULT_GRID": "defaults",
    "DEFAULT_KV_LENS": "defaults",
    "DEFAULT_PRESET": "acceptance", "PRESET_TARGETS": "acceptance",
    "AcceptanceModel": "acceptance", "load_acceptance": "acceptance", "preset": "acceptance",
    "EFFICIENCY": "costmodel", "Efficiency": "costmodel", "RooflineForward": "costmodel",
    "efficiency_for": "costmodel",
    "Budget": "selection", "select_b_ver": "selection",
    "BucketCosts": "decision", "Choice": "decision", "decide": "decision", "price": "decision",
    "EXACT": "sweep", "StepTimer": "sweep", "SweepResult": "sweep", "Timing": "sweep",
    "build_profile": "sweep", "measure": "sweep", "run_sweep": "sweep",
    "write_profile": "sweep",
    "plot_profile": "plot", "plot_path_for": "plot",
    "summary_rows": "summary",
    "CalibrationPlan": "pipeline", "CalibrationResult": "pipeline",
    "plan_calibration": "pipeline", "run_calibration": "pipeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bole_cli.calibrate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"bole_cli.calibrate.{module}"), name)
