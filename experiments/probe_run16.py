"""GPU A/B (device call 16): verify v4 (level walk) vs v6 (walk 8 levels, then square) vs
v7 (pointer jumping: shipped), random and chain trees; same cases as bench/probe_run15.py.

    python3 bench/probe_run16.py OUT.json
"""

import importlib.util
import sys

sys.path.insert(0, "bench")
import probe_run14 as p14  # noqa: E402
import probe_run15 as p15  # noqa: E402

spec = importlib.util.spec_from_file_location("v6", "bench/variants/tree_verify_tile_v6_hybrid.py")
v6 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(v6)
p15.VERIFY = {"v4_walk": p14.VERIFY["v4_walk"], "v6_hybrid": v6.tree_verify_tile_kernel,
              "v7_shipped": p14.verify_mod.tree_verify_tile_kernel}

if __name__ == "__main__":
    p15.main(sys.argv[1])
