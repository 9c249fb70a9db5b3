"""The served precision against float64, beside the other precisions and SGLang's verify
(docs/design.md §9; experiments/README.md, row P-1): bole_cli/bench/precision.py measures,
this writes the record. Cases: chains of 16/64/256 and random trees of 64/32/256 (batch
4/4/2, 4/16/2) at the Qwen3.5-9B GDN shape, bf16 q/k/v, float32 and bf16 state pools, mild
(g in [-0.05, 0]) and strong (g in [-3, 0]) decay. SGLang's chunk kernel (prefill) is not
loaded here; its row stands in experiments/NOTES.md "Precision contract".

    python experiments/precision_contract.py --out experiments/results/precision/contract-h200.json
    python experiments/precision_contract.py --device cpu --smoke   # the arithmetic on CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent

from bole_cli.bench.precision import (CASES, DECAYS, DRIFT, IMPLS, SMOKE_CASES, committed_reference, drift,
                                      make_inputs, reference, rms, run_impl)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON record (default: print only)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and 3 drift steps (CPU check)")
    ap.add_argument("--no-sglang", action="store_true")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import triton

    from bole_cli.catalog.models import resolve_model

    spec = resolve_model("9b")
    cases, steps = CASES, DRIFT["steps"]
    if args.smoke:
        spec = SimpleNamespace(gdn_key_heads=2, gdn_value_heads=4, gdn_key_dim=16, gdn_value_dim=16)
        cases, steps = SMOKE_CASES, 3
    sg = None
    impls = [i for i in IMPLS if i != "sglang-recurrent" or not args.no_sglang]
    if "sglang-recurrent" in impls:
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels

        sg = load_sglang_kernels()
    rows = []
    t0 = time.time()
    for state_name in ("float32", "bfloat16"):
        sdt = getattr(torch, state_name)
        for decay in DECAYS:
            after = {impl: drift(torch, spec, impl, decay, sdt, sg, args.device, steps)
                     for impl in impls if state_name == "float32" or impl == "served"}
            for tree, nodes, batch in cases:
                s = make_inputs(torch, spec, tree, nodes, batch, decay, 11 * nodes + batch, sdt, args.device)
                o_ref, states = reference(torch, s)
                want = committed_reference(torch, s, states)
                floor = rms(o_ref.to(torch.bfloat16), o_ref)
                for impl in after:
                    o, pool = run_impl(torch, impl, s, sg)
                    row = {"case": f"{tree}-{nodes}x{batch}-{decay}-{state_name}", "impl": impl,
                           "state_dtype": state_name, "o_rms": rms(o, o_ref), "o_floor_rms": floor,
                           "state_rms_single": rms(pool[s.slots.long()], want),
                           "state_floor_rms": rms(want.to(sdt), want) if sdt != torch.float32 else None,
                           "state_rms_after_400": after[impl]}
                    rows.append(row)
                    print(f"{row['case']:34s} {impl:17s} o/floor {row['o_rms'] / floor:5.2f}  "
                          f"state {row['state_rms_single']:.1e}  after {steps} {row['state_rms_after_400']:.1e}",
                          flush=True)
                del s, o_ref, states
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
           "versions": {"torch": torch.__version__, "triton": triton.__version__,
                        "sglang": getattr(sg, "version", None), "python": platform.python_version()},
           "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:])),
           "seconds": round(time.time() - t0, 1), "drift": dict(DRIFT, steps=steps),
           "targets": {"o_over_floor": 1.4, "state_rms": 1e-5}, "rows": rows}
    served = [r for r in rows if r["impl"] == "served" and r["state_dtype"] == "float32"]
    doc["served_met"] = all(r["o_rms"] <= 1.4 * r["o_floor_rms"] and r["state_rms_single"] <= 1e-5
                            and r["state_rms_after_400"] <= 1e-5 for r in served)
    print(f"served contract met (float32 pools): {doc['served_met']}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(out)
    return 0 if all(math.isfinite(r["o_rms"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
