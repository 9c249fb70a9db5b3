"""GPU probe (device call 13): where the time goes, and commit variants.

    python3 bench/probe_run13.py OUT.json

1. tree_commit, all 24 GDN layers of Qwen3.5-9B at batch 16 (the issue's target 4):
   c4 (shipped) against two rewrites that keep the [BV, K] state tile out of the dot
   (cA: update accumulated from zero, added once; cB: cA with the state read after the
   walk), over launch knobs. Each result is checked against c4's before it is timed.
2. tree_verify's one-tile kernel with one stage left out at a time (walk, Gram, solve,
   state products, the whole value loop): the differences place the time.
3. The launch floor: an empty Triton kernel timed the same way (CUDA graph, do_bench median).

Variants are made by editing the shipped kernels' source text, so they cannot drift.
"""

import importlib
import importlib.util
import json
import sys

import torch
import triton

from bole_cli import kernels
from bole_cli.bench.kernel_bench import LayerInputs, time_graph, warm_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.kernels.reference import VerifyResult

sys.path.insert(0, "bench")
from variant_edits import load_variant  # noqa: E402

# the modules (bole_cli.kernels re-exports functions of the same names); the variants are
# edits of the kernels as they were at run 13 (commit c4, verify v4), kept in bench/variants/
commit_mod = importlib.import_module("bole_cli.kernels.tree_commit")
verify_mod = importlib.import_module("bole_cli.kernels.tree_verify")


def _load_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


c4_mod = _load_file("bench/variants/tree_commit_c4.py", "commit_c4_base")
tile_mod = _load_file("bench/variants/tree_verify_tile_v4_walk.py", "tile_v4_base")
COMMIT = {
    "c4": [],
    "cA": [("acc = acc * tl.exp(lp_a)\n",
            "p_a = tl.exp(lp_a)\n        delta = tl.zeros([BV, KP], dtype=tl.float32)\n"),
           ("acc += tl.dot(tl.trans(uj", "delta += tl.dot(tl.trans(uj"),
           ("tl.store(s_ptr, acc.to(", "acc = acc * p_a + delta\n        tl.store(s_ptr, acc.to(")],
}
COMMIT["cB"] = COMMIT["cA"][:-1] + [
    ("        acc = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32)  # in flight during the walk\n", ""),
    ("tl.store(s_ptr, acc.to(",
     "acc = tl.load(s_ptr, mask=tile_mask, other=0.0).to(tl.float32) * p_a + delta\n"
     "        tl.store(s_ptr, acc.to(")]

KEEP = "        if part == 0:\n            tl.store(log_p + rows_g * s_ln + hv, lp, mask=rmask)"
KEEP_ALL = KEEP.replace("lp, mask", "lp + 0.0 * (tl.sum(ce, axis=1) + tl.sum(ainv, axis=1)), mask")
VERIFY = {
    "full": [],
    "no_solve": [("while covered < depth:", "while covered < 0:")],
    "no_walk_solve": [("while covered < depth:", "while covered < 0:"),
                      ("while tl.max(cur, axis=0) >= 0:", "while tl.max(cur, axis=0) >= 1 << 30:")],
    "no_gram": [("        for kb in range(0, KP, BK):\n            offs = kb + tl.arange(0, BK)\n            m2",
                 "        for kb in range(0, 0, BK):\n            offs = kb + tl.arange(0, BK)\n            m2")],
    "no_state": [("            for kb in range(0, KP, BK):", "            for kb in range(0, 0, BK):")],
    "no_values": [("for vt in range(0, VT, BV):\n            offs_v = part", "for vt in range(0, 0, BV):\n            offs_v = part"),
                  (KEEP, KEEP_ALL)],
}


@triton.jit
def _empty_kernel(x):
    pass


def main(out_path: str) -> None:
    spec = resolve_model("9b")
    warm_gpu(torch)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "command": "python3 bench/probe_run13.py"}

    # 3. launch floor
    dummy = torch.empty(1, device="cuda")
    report["empty_launch_us"] = {g: time_graph(torch, [lambda g=g: _empty_kernel[(g,)](dummy)])
                                 for g in (1, 128, 1024)}
    print("empty launch us", report["empty_launch_us"], flush=True)

    # 1. commit variants, 24 layers at batch 16
    layers, batch, nodes = spec.n_gdn_layers, 16, 64
    base = LayerInputs(torch, spec, batch, nodes, "random", 7, torch.bfloat16, torch.float32)
    n = batch * nodes
    pool0 = torch.randn(layers, batch + 1, 32, 128, 128, device="cuda")
    k = torch.randn(layers, n, 16, 128, device="cuda").to(torch.bfloat16)
    u = torch.randn(layers, n, 32, 128, device="cuda")
    lp = -torch.rand(layers, n, 32, device="cuda")
    pool = pool0.clone()

    def commit(cfg):
        kernels.tree_commit(pool, base.slots, k, u, lp, base.parents, base.cu, base.accepted,
                            check_trees=False, config=cfg)

    shipped = commit_mod._tree_commit_kernel
    pool.copy_(pool0)
    commit({"BV": 64, "num_warps": 4, "num_stages": 1})
    ref = pool.clone()
    rows = []
    knobs = [(16, 2, 1), (16, 4, 1), (32, 2, 1), (32, 4, 1), (32, 4, 2), (64, 4, 1), (64, 4, 2),
             (64, 8, 1), (128, 8, 1)]
    for name, edits in COMMIT.items():
        commit_mod._tree_commit_kernel = load_variant(c4_mod, edits, f"commit_{name}")._tree_commit_kernel
        for bv, w, st in knobs:
            cfg = {"BV": bv, "num_warps": w, "num_stages": st}
            try:
                pool.copy_(pool0)
                commit(cfg)
                err = ((pool - ref).norm() / ref.norm()).item()
                us = time_graph(torch, [lambda c=cfg: commit(c)], rep_ms=60)
            except Exception as exc:  # noqa: BLE001
                print("skip", name, cfg, type(exc).__name__, str(exc)[:100], flush=True)
                continue
            rows.append({"variant": name, **cfg, "us": us, "rel_err_vs_c4": err})
            print(f"commit {name} BV{bv} w{w} s{st}: {us:7.1f} us  err {err:.1e}", flush=True)
    commit_mod._tree_commit_kernel = shipped
    report["commit_24_layers_b16"] = rows
    pool = pool0 = ref = k = u = lp = None  # free the 24-layer buffers

    # 2. verify stage placement
    shipped_tile = verify_mod.tree_verify_tile_kernel
    vrows = []
    for batch, nodes, tree in ((1, 16, "random"), (4, 32, "random"), (16, 64, "random"), (16, 64, "chain")):
        s = LayerInputs(torch, spec, batch, nodes, tree, 11, torch.bfloat16, torch.float32)
        n = batch * nodes
        out = VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                           torch.empty(n, 32, device="cuda"))
        for name, edits in VERIFY.items():
            verify_mod.tree_verify_tile_kernel = load_variant(tile_mod, edits, f"tile_{name}").tree_verify_tile_kernel

            def run():
                kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                          s.parents, s.cu, check_trees=False, max_nodes=nodes, out=out)
            run()
            us = time_graph(torch, [run], rep_ms=60)
            vrows.append({"batch": batch, "nodes": nodes, "tree": tree, "variant": name, "us": us})
            print(f"verify B{batch} T{nodes} {tree:6s} {name:14s} {us:7.1f} us", flush=True)
        verify_mod.tree_verify_tile_kernel = shipped_tile
    report["verify_stages"] = vrows
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)

    print("\nbest commit per variant (24 layers, batch 16):")
    for name in COMMIT:
        best = min((r for r in rows if r["variant"] == name), key=lambda r: r["us"], default=None)
        if best:
            print(f"  {name}: {best['us']:.1f} us at BV{best['BV']} w{best['num_warps']} s{best['num_stages']}")


if __name__ == "__main__":
    main(sys.argv[1])
