"""The lowest batch-16 / batch-1 decode ratio the copy rate allows, per model.

A batch-16 decode step reads the same weights as a batch-1 step, and on top moves fifteen more
requests' recurrent state (read and written back, every GDN layer) and KV cache (read, every
attention layer). At the H200's measured copy rate that extra traffic takes a fixed time, so
batch 16 / batch 1 >= 1 + extra / T1 whatever the kernels do. A batch-1 step made faster
(T1 smaller) makes the ratio's bound larger: the two decode targets (batch 1 at a share of the
weight-read floor, batch 16 within a ratio of batch 1) can contradict each other. Prints the
bound at the floor, at the batch-1 target and at the batch 1 of the shipped measured H200
profile (profiles/h200/), and the smallest batch-1 time at which the ratio target can hold;
experiments/NOTES.md "What the copy rate leaves the batch-16 ratio" reads it.

    python experiments/batch_ratio_bound.py [--json]
"""
from __future__ import annotations

import argparse
import json

from bole_cli.calibrate.costmodel import BF16, _layer_matmuls, _mlp_matmuls
from bole_cli.catalog.hardware import resolve_gpu
from bole_cli.catalog.models import resolve_model

KV = 1024  # the decode targets' context
BATCH = 16
RATIO_TARGET = 1.15
TARGETS = {"4b": 2.8, "9b": 4.65, "27b": 15.0}  # batch-1 targets (ms)


def weight_bytes(m) -> float:
    """Weights one decode step reads: every projection once, and the LM head (not the embedding)."""
    per = sum(i * o * w for i, o, w, _ in _layer_matmuls(m, True)) * m.n_attention_layers
    per += sum(i * o * w for i, o, w, _ in _layer_matmuls(m, False)) * m.n_gdn_layers
    per += sum(i * o * w for i, o, w, _ in _mlp_matmuls(m, 1)) * m.layers
    return (per + m.hidden * m.vocab) * BF16


def measured_batch1_s(m) -> float:
    """T_dec at batch 1, kv KV of the shipped measured H200 profile (its serving step)."""
    from bole_cli.profiles import load_profile, profile_path, shipped_profiles_dir

    configs = load_profile(profile_path(shipped_profiles_dir(), "h200", m.name))["configs"]
    return next(c["t_dec"] for c in configs if (c["batch"], c["kv_len"]) == (1, KV))


def bound(name: str) -> dict:
    m, gpu = resolve_model(name), resolve_gpu("h200")
    rate = gpu.measured_mem_bandwidth
    per_request = 2 * m.gdn_state_bytes() + KV * m.kv_bytes_per_token()  # state r + w, KV read
    extra_s = (BATCH - 1) * per_request / rate
    floor_s = weight_bytes(m) / rate
    target_s, measured_s = TARGETS[name] / 1e3, measured_batch1_s(m)
    return {"model": m.name, "floor_ms": floor_s * 1e3, "extra_ms": extra_s * 1e3,
            "bound_at_floor": 1 + extra_s / floor_s, "bound_at_target": 1 + extra_s / target_s,
            "bound_at_measured": 1 + extra_s / measured_s, "target_ms": target_s * 1e3,
            "measured_ms": measured_s * 1e3,
            "min_batch1_for_ratio_ms": extra_s / (RATIO_TARGET - 1) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    rows = [bound(n) for n in TARGETS]
    if ap.parse_args().json:
        print(json.dumps(rows, indent=1))
        return
    print(f"batch {BATCH} / batch 1 at kv {KV}, H200 copy rate; ratio target {RATIO_TARGET}")
    print(f"{'model':<14}{'floor':>7}{'extra':>7}{'@floor':>8}{'@target':>9}{'@meas.':>8}{'T1 min':>8}")
    for r in rows:
        print(f"{r['model'].split('/')[-1]:<14}{r['floor_ms']:7.2f}{r['extra_ms']:7.3f}"
              f"{r['bound_at_floor']:8.3f}{r['bound_at_target']:9.3f}{r['bound_at_measured']:8.3f}"
              f"{r['min_batch1_for_ratio_ms']:8.2f}")
    print("ms; T1 min: the batch-1 step below which the ratio target cannot hold")


if __name__ == "__main__":
    main()
