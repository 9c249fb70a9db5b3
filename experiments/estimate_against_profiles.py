"""`bole calibrate --estimate` against a GPU's shipped measured profiles, cell by cell.

For each model with a measured profile under profiles/<gpu>/, the estimate is made as
`bole calibrate --gpu <gpu> --model <model> --estimate` makes it, over the profile's own
batches and contexts, and compared: T_dec, the decided configuration's tokens/s and its
mode (none, chain, tree), with the tolerances the H200's CPU test holds (10%, 15%, the same
mode). `--efficiency-from h200` prices the estimate with another GPU's cost-model entry
(bole_cli.calibrate.costmodel.EFFICIENCY) instead of its own: the H200's measured runtime
shares on the H100's datasheet, to see whether they carry over. CPU only.

    python experiments/estimate_against_profiles.py --gpu h100 [--efficiency-from h200] [--out F]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

T_DEC_TOL, TOK_S_TOL = 0.10, 0.15
MODELS = ("Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B")


def estimated(gpu: str, model: str, batches: list[int], kvs: list[int]) -> dict:
    from bole_cli.calibrate.defaults import DEFAULT_EPS, DEFAULT_GRID
    from bole_cli.calibrate.pipeline import plan_calibration, run_calibration

    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_calibration(gpu=gpu, model=model, batches=batches, kvs=kvs, points=list(DEFAULT_GRID),
                                eps=DEFAULT_EPS, out=Path(tmp) / "estimate.yaml", estimate=True)
        return run_calibration(plan, plot=False).profile


def compare(gpu: str, model: str, measured: dict) -> list[dict]:
    """One row a cell of the measured profile `measured`, its estimate beside it."""
    cells = measured["configs"]
    est = estimated(gpu, model, sorted({c["batch"] for c in cells}), sorted({c["kv_len"] for c in cells}))
    by_cell = {(c["batch"], c["kv_len"]): c for c in est["configs"]}
    rows = []
    for c in cells:
        e = by_cell[(c["batch"], c["kv_len"])]
        got, want = e["decision"]["chosen"], c["decision"]["chosen"]
        rows.append({"model": model, "batch": c["batch"], "kv": c["kv_len"],
                     "t_dec_est_ms": e["t_dec"] * 1e3, "t_dec_meas_ms": c["t_dec"] * 1e3,
                     "t_dec_err": e["t_dec"] / c["t_dec"] - 1, "tok_s_err": got["tok_s"] / want["tok_s"] - 1,
                     "est": got.get("label", got["mode"]), "meas": want.get("label", want["mode"]),
                     "same_mode": got["mode"] == want["mode"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="a GPU with measured profiles under profiles/")
    ap.add_argument("--efficiency-from", default=None, help="price with this GPU's cost-model entry")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    from bole_cli.calibrate import costmodel
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.profiles import load_profile, profile_path, shipped_profiles_dir

    gpu = resolve_gpu(args.gpu).key
    profiles = {}
    for model in MODELS:
        path = profile_path(shipped_profiles_dir(), gpu, model)
        profiles[model] = load_profile(path) if path.is_file() else None
        if profiles[model] is None or profiles[model]["provenance"]["kind"] != "measured":
            ap.error(f"--gpu {args.gpu}: no measured profile profiles/{gpu}/{model}.yaml")
    if args.efficiency_from:
        donor = resolve_gpu(args.efficiency_from, "--efficiency-from").key
        own = costmodel.efficiency_for(resolve_gpu(gpu))
        costmodel.EFFICIENCY[gpu] = dataclasses.replace(costmodel.EFFICIENCY[donor], l2_bytes=own.l2_bytes)
    rows = [r for m in MODELS for r in compare(gpu, m, profiles[m])]
    misses = {"t_dec": sum(abs(r["t_dec_err"]) > T_DEC_TOL for r in rows),
              "tok_s": sum(abs(r["tok_s_err"]) > TOK_S_TOL for r in rows),
              "mode": sum(not r["same_mode"] for r in rows)}
    if args.out:
        measured_on = {m: {k: profiles[m]["provenance"][k]
                           for k in ("device_name", "torch_version", "triton_version", "date", "command")}
                       for m in MODELS}
        args.out.write_text(json.dumps({"gpu": gpu, "efficiency_from": args.efficiency_from,
                                        "measured_on": measured_on, "estimated_on": "CPU (the roofline model)",
                                        "command": " ".join(["python"] + sys.argv), "cells": len(rows),
                                        "misses": misses, "rows": rows}, indent=1) + "\n")
    print(f"{gpu} estimate ({args.efficiency_from or gpu}'s cost model) against profiles/{gpu}/")
    print(f"{'model':<6}{'b':>3}{'kv':>6}{'T_dec est/meas':>16}{'err':>6}{'tok/s':>7}  decided est / meas")
    for r in rows:
        print(f"{r['model'].split('-')[-1]:<6}{r['batch']:>3}{r['kv']:>6}"
              f"{r['t_dec_est_ms']:8.2f}/{r['t_dec_meas_ms']:<7.2f}{r['t_dec_err']:+6.2f}{r['tok_s_err']:+7.2f}"
              f"  {r['est'].replace('tree ', '')} / {r['meas'].replace('tree ', '')}")
    print(f"outside: T_dec {misses['t_dec']}, tok/s {misses['tok_s']}, mode {misses['mode']} "
          f"of {len(rows)} cells (10%, 15%, same mode)")


if __name__ == "__main__":
    main()
