"""Grid over tree_verify variants and launch configs at the headline shapes (GPU).

Variants: "v3" is the package's kernel (key-dim slices of BK); "v2" is the previous one,
kept in bench/variants/ (state tile in registers, whole-K operands). Each config's output is
checked against v3's default before it is timed. Prints the best per shape; JSON to argv[1].

    python3 bench/sweep_verify.py OUT.json
"""

import importlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import torch

from bole_cli.bench.kernel_bench import ROTATE, LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

v3 = importlib.import_module("bole_cli.kernels.tree_verify")  # the module, not the function
spec_v2 = importlib.util.spec_from_file_location("tree_verify_v2", Path(__file__).parent / "variants/tree_verify_v2.py")
v2 = importlib.util.module_from_spec(spec_v2)
spec_v2.loader.exec_module(v2)

VARIANTS = {
    "v2": (v2, [dict(BC=bc, BV=bv, num_warps=w) for bc, bv, w in itertools.product([16, 32, 64], [32, 64, 128], [2, 4])]),
    "v3": (v3, [dict(BC=bc, BV=bv, BK=bk, num_warps=w)
                for bc, bv, bk, w in itertools.product([16, 32], [32, 64, 128], [32, 64], [2, 4])]),
}
SHAPES = list(itertools.product([1, 4, 16, 64], [16, 64]))

model = resolve_model("9b")
warm_gpu(torch)
rows = []
for batch, nodes in SHAPES:
    sets = [LayerInputs(torch, model, batch, nodes, "random", 100 * i + nodes, torch.bfloat16, torch.float32)
            for i in range(ROTATE)]
    n = batch * nodes

    def outs():
        return [VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                             torch.empty(n, 32, device="cuda")) for s in sets]

    ref = outs()[0]
    s0 = sets[0]
    v3.tree_verify_gated(s0.q, s0.k, s0.v, s0.a, s0.b, s0.A_log, s0.dt_bias, s0.pool, s0.slots, s0.parents,
                         s0.cu, check_trees=False, out=ref)
    best = {}
    for name, (mod, configs) in VARIANTS.items():
        for cfg in configs:
            o = outs()
            fns = [(lambda s=s, oo=oo, c=cfg: mod.tree_verify_gated(
                s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents, s.cu,
                check_trees=False, out=oo, config=c)) for s, oo in zip(sets, o)]
            try:
                fns[0]()
                err = ((o[0].o.float() - ref.o.float()).norm() / ref.o.float().norm()).item()
                if not err < 5e-3:
                    print("WRONG", name, cfg, err, flush=True)
                    continue
                us = time_graph(torch, fns, rep_ms=40)
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                print("skip", name, cfg, type(exc).__name__, str(exc)[:80], flush=True)
                continue
            rows.append({"variant": name, "batch": batch, "nodes": nodes, **cfg, "us": us})
            if name not in best or us < best[name][1]:
                best[name] = (cfg, us)
    print(f"B={batch:3d} T={nodes:3d} " + "  ".join(f"{k}: {v[1]:.1f} us {v[0]}" for k, v in best.items()), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
