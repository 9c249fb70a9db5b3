"""GPU grid: one-tile tree_verify (v4) configs vs the blocked kernel (v3), and commit c4 vs c1.

    python3 bench/sweep_v4.py OUT.json

Compiles every config in parallel worker processes first (Triton's cache is shared), then
times in this process only: CUDA graphs over 4 rotating input sets, do_bench median. Each
verify config's o is checked against v3's before it is timed; the commit variants are
checked against each other. Prints the best per shape last.
"""

import importlib.util
import itertools
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent
TREE_NODES = (16, 32, 64)
BATCHES = (1, 4, 16, 64)


def tile_configs():
    seen, out = set(), []
    for bv, bk, vs, w in itertools.product((16, 32, 64), (32, 64), (1, 2, 4), (2, 4, 8)):
        if bv == 16 and (bk, w) != (32, 4):
            continue
        if w == 2 and (bv, bk) != (32, 32):
            continue
        from bole_cli.kernels.tree_verify_tile import value_split

        eff = (bv, bk, value_split(128, bv, vs), w)
        if eff in seen:
            continue
        seen.add(eff)
        out.append({"BV": bv, "BK": bk, "VSPLIT": vs, "num_warps": w})
    return out


def load_variant(name):
    spec = importlib.util.spec_from_file_location(name, HERE / "variants" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(batch, nodes, seed):
    from bole_cli.bench.kernel_bench import LayerInputs
    from bole_cli.catalog.models import resolve_model

    return LayerInputs(torch, resolve_model("9b"), batch, nodes, "random", seed, torch.bfloat16, torch.float32)


def _verify(mod, s, out, cfg, tile):
    extra = {"max_nodes": s.nodes} if tile else {}
    mod.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents, s.cu,
                          check_trees=False, out=out, config=cfg, **extra)


def _outs(s):
    from bole_cli.kernels.reference import VerifyResult

    n = s.q.shape[0]
    return VerifyResult(torch.empty_like(s.v), torch.empty(n, 32, 128, device="cuda"),
                        torch.empty(n, 32, device="cuda"))


def warm(job):
    """Worker: compile one config for every tree size (B=1 launches)."""
    cfg = job
    from bole_cli import kernels

    for nodes in TREE_NODES:
        s = _inputs(1, nodes, 5)
        try:
            _verify(kernels, s, _outs(s), cfg, True)
        except Exception as exc:  # noqa: BLE001
            return f"{cfg}: {type(exc).__name__} {str(exc)[:80]}"
    torch.cuda.synchronize()
    return None


def main(path):
    from bole_cli import kernels
    from bole_cli.bench.kernel_bench import ROTATE, time_graph, warm_gpu
    from bole_cli.catalog.models import resolve_model

    t0 = time.time()
    configs = tile_configs()
    with mp.get_context("spawn").Pool(12) as pool:
        for msg in pool.imap_unordered(warm, configs):
            if msg:
                print("compile:", msg, flush=True)
    print(f"compiled {len(configs)} configs x {len(TREE_NODES)} sizes in {time.time() - t0:.0f} s", flush=True)

    warm_gpu(torch)
    rows, table = [], []
    for batch, nodes in itertools.product(BATCHES, TREE_NODES):
        sets = [_inputs(batch, nodes, 100 * i + nodes) for i in range(ROTATE)]
        ref = _outs(sets[0])
        _verify(kernels, sets[0], ref, None, False)
        v3_us = time_graph(torch, [lambda s=s, o=_outs(s): _verify(kernels, s, o, None, False) for s in sets], rep_ms=40)
        rows.append({"variant": "v3-rule", "batch": batch, "nodes": nodes, "us": v3_us})
        rule_us = time_graph(torch, [lambda s=s, o=_outs(s): _verify(kernels, s, o, None, True) for s in sets], rep_ms=40)
        rows.append({"variant": "v4-rule", "batch": batch, "nodes": nodes, "us": rule_us})
        best = (None, math.inf)
        for cfg in configs:
            o = [_outs(s) for s in sets]
            try:
                _verify(kernels, sets[0], o[0], cfg, True)
                err = max(((getattr(o[0], f).float() - getattr(ref, f).float()).norm()
                           / getattr(ref, f).float().norm()).item() for f in ("o", "u", "log_p"))
                if not err < 5e-3:
                    print("WRONG", batch, nodes, cfg, err, flush=True)
                    continue
                us = time_graph(torch, [lambda s=s, oo=oo, c=cfg: _verify(kernels, s, oo, c, True)
                                        for s, oo in zip(sets, o)], rep_ms=40)
            except Exception as exc:  # noqa: BLE001
                print("skip", cfg, type(exc).__name__, str(exc)[:80], flush=True)
                continue
            rows.append({"variant": "v4", "batch": batch, "nodes": nodes, **cfg, "us": us, "err": err})
            if us < best[1]:
                best = (cfg, us)
        table.append((batch, nodes, v3_us, rule_us, best))
        print(f"B{batch:3d} T{nodes:3d}  v3 {v3_us:7.1f}  v4-rule {rule_us:7.1f}  v4-best {best[1]:7.1f} {best[0]}",
              flush=True)
        del sets
        torch.cuda.empty_cache()

    # commit: c1 (variant) vs c4 (package), one layer and all 24 layers at batch 16
    c1 = load_variant("tree_commit_c1")
    spec = resolve_model("9b")
    commit_rows = []
    for batch, layers in ((1, 1), (16, 1), (64, 1), (16, spec.n_gdn_layers)):
        base = _inputs(batch, 64, 7)
        n = batch * 64
        pool0 = torch.randn(layers, batch + 1, 32, 128, 128, device="cuda")
        k = torch.randn(layers, n, 16, 128, device="cuda").to(torch.bfloat16)
        u = torch.randn(layers, n, 32, 128, device="cuda")
        lp = -torch.rand(layers, n, 32, device="cuda")
        want = pool0.clone()
        kernels.tree_commit(want, base.slots, k, u, lp, base.parents, base.cu, base.accepted, check_trees=False)
        for name, mod, cfgs in (("c1", c1, [{"BV": bv, "num_warps": w} for bv in (32, 64, 128) for w in (4, 8)]),
                                ("c4", kernels, [{"BV": bv, "num_warps": w} for bv in (16, 32, 64, 128) for w in (2, 4, 8)])):
            for cfg in cfgs:
                pool = pool0.clone()
                try:
                    mod.tree_commit(pool, base.slots, k, u, lp, base.parents, base.cu, base.accepted,
                                    check_trees=False, config=cfg)
                    err = ((pool - want).norm() / want.norm()).item()
                    us = time_graph(torch, [lambda p=pool, m=mod, c=cfg: m.tree_commit(
                        p, base.slots, k, u, lp, base.parents, base.cu, base.accepted, check_trees=False, config=c)],
                        rep_ms=60)
                except Exception as exc:  # noqa: BLE001
                    print("skip", name, cfg, type(exc).__name__, str(exc)[:80], flush=True)
                    continue
                commit_rows.append({"variant": name, "batch": batch, "layers": layers, **cfg, "us": us, "err": err})
        del pool0, want, k, u, lp
        torch.cuda.empty_cache()

    print("\n== verify (us): v3 = blocked kernel, its rule; v4 = one-tile kernel")
    for batch, nodes, v3_us, rule_us, best in table:
        print(f"B{batch:3d} T{nodes:3d}  v3 {v3_us:7.1f}  v4-rule {rule_us:7.1f}  v4-best {best[1]:7.1f}  {best[0]}")
    print("\n== commit (us), best config per variant")
    for key in sorted({(r["batch"], r["layers"]) for r in commit_rows}):
        line = f"B{key[0]:3d} L{key[1]:2d}"
        for name in ("c1", "c4"):
            rs = [r for r in commit_rows if (r["batch"], r["layers"]) == key and r["variant"] == name]
            if rs:
                b = min(rs, key=lambda r: r["us"])
                line += f"  {name} {b['us']:8.1f} (BV{b['BV']} w{b['num_warps']}, err {b['err']:.1e})"
        print(line)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "command": "python3 bench/sweep_v4.py",
               "verify": rows, "commit": commit_rows}, open(path, "w"), indent=1)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
