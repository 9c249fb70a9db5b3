"""GPU A/B (device call 23): verify v7 (shipped) vs v8 (when the tree's depth is exactly one
more than the powers covered, the product form's last step adds G^depth instead of
multiplying: one [T, T] product fewer at depths 2, 4 and 8); same cases as
bench/probe_run15.py. Run 23 ran with v8 in place and v7 as the variant; the labels
below are the kernels' names either way.

    python3 bench/probe_run23.py OUT.json
"""

import importlib
import sys

sys.path.insert(0, "bench")
import probe_run14 as p14  # noqa: E402
import probe_run15 as p15  # noqa: E402

from variant_edits import load_variant  # noqa: E402

V8_EDITS = [("""                ainv += tl.dot(gpow, ainv, input_precision=PRECISION)
""", """                if depth == covered + 1:  # only the power G^depth itself is missing: add it
                    ainv += gpow
                else:
                    ainv += tl.dot(gpow, ainv, input_precision=PRECISION)
""")]
v8 = load_variant(importlib.import_module("bole_cli.kernels.tree_verify_tile"), V8_EDITS, "tile_v8")
p15.VERIFY = {"v7": p14.verify_mod.tree_verify_tile_kernel, "v8": v8.tree_verify_tile_kernel}

if __name__ == "__main__":
    p15.main(sys.argv[1])
