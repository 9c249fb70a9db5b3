"""The roofline's H200 factors (costmodel.EFFICIENCY["h200"]) re-derived from component and
step records by calibrate.components.factors, beside the values the code holds: what to
write into costmodel.py after a new `knee` or `steps` run (experiments/owed_h200.sh), and by
how much each moves. Defaults: the records the code comes from (components.H200_RECORDS), so
a run without arguments shows every factor unchanged.

    python experiments/derive_factors.py
    python experiments/derive_factors.py --components components/h200-9b-s11.json \\
        --steps runtime/s11/steps-h200.json --out /tmp/factors.json

A record path is taken as given where that file exists, else under experiments/results/.
Index: experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _flat(value) -> list[float]:
    return [x for cell in value for x in cell] if isinstance(value, (tuple, list)) else [value]


def change(code, derived) -> str:
    """The largest relative move between two values of one factor (cells: element by
    element), or "shape" where the cells differ in number."""
    a, b = _flat(code), _flat(derived)
    if len(a) != len(b):
        return "shape"
    moves = [abs(y - x) / abs(x) if x else abs(y) for x, y in zip(a, b)]
    return f"{max(moves, default=0.0):.1%}"


def main(argv=None) -> None:
    from bole_cli.calibrate.components import H200_RECORDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--components", default=H200_RECORDS["components"], help="component_bench.py's JSON")
    ap.add_argument("--steps", default=",".join(H200_RECORDS["steps"]),
                    help="runtime_step_bench.py's JSONs, comma-separated")
    ap.add_argument("--tree-kernels", default=H200_RECORDS["tree_kernels"],
                    help="`bole bench kernels` JSON at the served default")
    ap.add_argument("--out", help="also write the factors and the code's values here (JSON)")
    args = ap.parse_args(argv)

    from bole_cli.calibrate.components import code_factors, factors
    from bole_cli.catalog.hardware import resolve_gpu

    def read(option: str, path: str):
        full = Path(path) if Path(path).is_file() else RESULTS / path
        if not full.is_file():
            print(f"error: {option} {path}: no such record, here or under {RESULTS}", file=sys.stderr)
            raise SystemExit(2)
        return json.loads(full.read_text())

    records = (read("--components", args.components), [read("--steps", p) for p in args.steps.split(",")],
               read("--tree-kernels", args.tree_kernels))
    derived = factors(*records, resolve_gpu("h200").bf16_flops)
    code = code_factors()
    for name, value in derived.items():
        shown = f"{len(value)} cells" if isinstance(value, tuple) else f"{value:.4g}"
        print(f"{name:32s} {shown:>10s}  moves {change(code[name], value)}")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"records": vars(args), "factors": derived, "code": code}, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
