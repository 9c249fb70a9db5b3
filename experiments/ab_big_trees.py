"""Issue 17 items 1-2 on the GPU, in one process: the big-tree verify kernels for 65-256-node
trees (bole_cli/kernels/tree_verify_blocked.py: the blocked kernel v10 and, for long chains, the
chain kernel) against a baseline, per launch config, plus the shipped commit, on random
(depth <= 8) trees and chains at the Qwen3.5-9B GDN shape (bf16 activations, float32 state).
The baseline is the shipped blocked kernel by its rule for every tree (CHAIN 0, LEVELS 0), or a copy
of an older tree_verify.py passed as --baseline; config R is the shipped launch rules. (The
v11 and v12 kernels of runs I17-c/d/e, with their configs, are in commit 1f7e8e9.)

    python experiments/ab_big_trees.py --configs R --batch 1,4,16,64 --nodes 128,192,256 --out OUT.json
    git show 9b66697:bole_cli/kernels/tree_verify.py > experiments/old_blocked.py  # v3, untracked
    python experiments/ab_big_trees.py --baseline experiments/old_blocked.py --configs A,E2 \
        --no-check --cells random:16x128

First every config is checked at real shapes against the float64 reference (random trees,
chains of 256, wide trees, several roots, 1-node requests; float32 and bf16 activations);
then each cell (ROTATE input sets, as `bole bench kernels`) is timed as a CUDA-graph replay
(do_bench median). A config may carry `maxnreg` (Triton's register cap, a launch option,
not a kernel config key). Notes: experiments/NOTES.md "Big trees"; index: experiments/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import sys
import time

CONFIGS = {
    # as shipped: the launch rules (long chains on the chain kernel, CHAIN 1)
    "R": {},
    # the blocked kernel (v10) alone, CHAIN 0
    "A": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 4},
    "B": {"BC": 64, "BV": 32, "BK": 32, "num_warps": 4},
    "C": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 8},
    "D": {"BC": 64, "BV": 128, "BK": 32, "num_warps": 8},
    "E": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 4},
    "F": {"BC": 32, "BV": 32, "BK": 32, "num_warps": 4},
    "H": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 4, "maxnreg": 128},
    "I": {"BC": 64, "BV": 32, "BK": 32, "num_warps": 4, "maxnreg": 128},
    "J": {"BC": 64, "BV": 16, "BK": 32, "num_warps": 4},
    # run 2: two warps, as the replaced kernel's rule had
    "A2": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 2},
    "B2": {"BC": 64, "BV": 32, "BK": 32, "num_warps": 2},
    "E2": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2},
    "K2": {"BC": 32, "BV": 32, "BK": 32, "num_warps": 2},
    # software pipelining of the key-slice loops (I17-h ran them: num_stages 2-3 lose everywhere)
    # (every config above ran num_stages 1: each slice's load waits a full L2 round trip)
    "E2S2": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "num_stages": 2},
    "E2S3": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "num_stages": 3},
    "AS2": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 4, "num_stages": 2},
    "BS2": {"BC": 64, "BV": 32, "BK": 32, "num_warps": 4, "num_stages": 2},
    # fifth session (I17-k): SPLIT, the state products and Gram terms in launches of their
    # own (tree_verify_parts.py) before the tree stage; "stage" times one side alone (the
    # other launches made no-ops: outputs meaningless, the time is what counts)
    "SA": {"BC": 64, "BV": 64, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SB": {"BC": 64, "BV": 32, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SD": {"BC": 64, "BV": 128, "BK": 32, "num_warps": 8, "SPLIT": 1},
    "SE": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SE2": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "SPLIT": 1},
    "SF": {"BC": 32, "BV": 32, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SK2": {"BC": 32, "BV": 32, "BK": 32, "num_warps": 2, "SPLIT": 1},
    "SG": {"BC": 32, "BV": 128, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SG8": {"BC": 32, "BV": 128, "BK": 32, "num_warps": 8, "SPLIT": 1},
    "SH": {"BC": 16, "BV": 128, "BK": 32, "num_warps": 4, "SPLIT": 1},
    "SGS2": {"BC": 32, "BV": 128, "BK": 32, "num_warps": 4, "num_stages": 2, "SPLIT": 1},
    "SE2-parts": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "SPLIT": 1, "stage": "parts"},
    "SE2-tree": {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "SPLIT": 1, "stage": "tree"},
}
# SG's stages alone, and the parts' launch settings ("parts": configs.PARTS_LAUNCH overrides)
for _stage in ("parts", "tree", "walk", "P", "G"):
    CONFIGS[f"SG-{_stage}"] = dict(CONFIGS["SG"], stage=_stage)
_P_SWEEP = {"P1": {"BR": 32}, "P2": {"num_stages": 2}, "P3": {"num_stages": 3},
            "P4": {"BV": 128, "num_warps": 8, "num_stages": 2}, "P5": {"BR": 128, "num_warps": 8, "num_stages": 2},
            "P6": {"BR": 32, "BV": 128, "num_stages": 2}, "P7": {"BK": 64, "num_stages": 2},
            "P8": {"BR": 32, "num_stages": 2}, "P9": {"BR": 32, "BV": 32, "num_stages": 2}}
_P_SWEEP.update({"P10": {"num_stages": 4}, "P11": {"BR": 128, "num_warps": 8, "num_stages": 3},
                 "P12": {"BV": 128, "num_warps": 8, "num_stages": 3}, "P13": {"BK": 64, "num_stages": 3},
                 "P14": {"BR": 32, "num_stages": 3}, "P15": {"num_stages": 1}})  # (P3's stages are shipped)
_G_SWEEP = {"G1": {"BG": 32}}
# the fused parts launch (all three roles) under other settings
for _name, _parts in {"PP1": {"num_stages": 2}, "PP2": {"num_warps": 8}, "PP3": {"BR": 128, "num_warps": 8},
                      "PP4": {"BV": 128, "num_warps": 8}, "PP5": {"num_stages": 4}}.items():
    CONFIGS[f"SG-{_name}"] = dict(CONFIGS["SG"], stage="parts", parts=_parts)
for _name, _parts in _P_SWEEP.items():
    CONFIGS[f"SG-{_name}"] = dict(CONFIGS["SG"], stage="P", parts=_parts)
for _name, _parts in _G_SWEEP.items():
    CONFIGS[f"SG-{_name}"] = dict(CONFIGS["SG"], stage="G", parts=_parts)
# sixth session (I17-l): the chain verify v13 (tree_verify_chain.py: the chunk factors in a
# wide launch, then the state scan) under other launch settings than its rule's (I17-l ran
# them as CHAIN 2 beside v12, CHAIN 1 then: commit 398a8b5)
for _name, _chain in {"BC32": {"BC": 32}, "BV16": {"BV": 16}, "BV32": {"BV": 32}, "w8": {"num_warps": 8},
                      "BV128w8": {"BV": 128, "num_warps": 8}, "s2": {"num_stages": 2},
                      "BC32BV32": {"BC": 32, "BV": 32}, "BC32BV16": {"BC": 32, "BV": 16},
                      "BC32w8": {"BC": 32, "num_warps": 8}, "BC16": {"BC": 16}, "BC64": {"BC": 64}}.items():
    CONFIGS[f"C13-{_name}"] = {"CHAIN": 1, "SPLIT": 1, **_chain}
# sixth session (I17-m): the level kernel (tree_verify_levels.py) for shallow trees, by its
# rule and under other settings, against SPLIT (LEVELS 0: the blocked kernel by its rule)
CONFIGS["S"] = {"LEVELS": 0}
CONFIGS["S-BV32"] = {"LEVELS": 0, "BV": 32}
for _name, _lev in {"BV16w4": {"BV": 16, "num_warps": 4}, "BV32w4": {"BV": 32, "num_warps": 4},
                    "BV16w8": {"BV": 16, "num_warps": 8}, "BV32w8": {"BV": 32, "num_warps": 8},
                    "BV64w8": {"BV": 64, "num_warps": 8}, "BK64": {"BK": 64}, "s2": {"num_stages": 2},
                    "RB32": {"RB": 32}}.items():  # (I17-m's GATHER configs: commit 111a5b6)
    CONFIGS[f"L-{_name}"] = {"LEVELS": 1, **_lev}
# seventh session (I17-q): the SGLang plug-in's verify (tf32x3 dots) with the drafter's depth
# promised (PL, as factors.py now launches it) and without (PL-none, as it launched until
# now: chain kernels too, never the level kernel); PL-S: SPLIT under the promise
CONFIGS["PL"] = {"CHAIN": 1, "precision": "tf32x3"}
CONFIGS["PL-none"] = {"CHAIN": 1, "precision": "tf32x3", "no_depth": 1}
CONFIGS["PL-S"] = {"CHAIN": 1, "precision": "tf32x3", "LEVELS": 0}
# V10: the whole blocked kernel by the rule it shipped with until I17-k (the baseline of
# SPLIT, side by side in the same process; launch() picks its config per cell)
CONFIGS["V10"] = {"SPLIT": 0, "v10_rule": 1}
for _name, _cfg in CONFIGS.items():
    _cfg.setdefault("CHAIN", int(_name == "R"))
    if "BC" in _cfg and "SPLIT" not in _cfg:
        _cfg["SPLIT"] = 0  # the configs before SPLIT ran the whole kernel (the rule now splits)


def v10_rule(batch: int, nodes: int, hv: int = 32) -> dict:
    """The blocked kernel's launch rule before SPLIT (configs._verify_blocked_rule until
    I17-k): trees of 65-256 nodes by request-heads."""
    lanes = batch * hv
    if lanes <= 32:
        return {"BC": 64, "BV": 32, "BK": 32, "num_warps": 4}
    if lanes < 512 or nodes > 160:
        return {"BC": 64, "BV": 64, "BK": 32, "num_warps": 4}
    return {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2}


class Capped:
    """The kernel launched with extra launch options (maxnreg)."""

    def __init__(self, kernel, opts):
        self.kernel, self.opts = kernel, opts

    def __getitem__(self, grid):
        return lambda *a, **kw: self.kernel[grid](*a, **kw, **self.opts)


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(a.isfinite().all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


class NoOp:
    """A kernel that launches nothing (a SPLIT stage timed alone)."""

    def __getitem__(self, grid):
        return lambda *a, **kw: None


SPLIT_KERNELS = ("tree_verify_blocked_kernel", "parts_kernel")
# the module whose global each launch reads (each kernel file launches its own kernel)
KERNEL_HOMES = {"tree_verify_blocked_kernel": "bole_cli.kernels.tree_verify_blocked",
                "parts_kernel": "bole_cli.kernels.tree_verify_parts"}
# a stage: (the SPLIT kernels it keeps, the parts' roles: 1 state products, 2 Gram, 4 walk)
STAGES = {"parts": (("parts_kernel",), 7), "tree": (("tree_verify_blocked_kernel",), 7), "walk": (("parts_kernel",), 4),
          "P": (("parts_kernel",), 1), "G": (("parts_kernel",), 2)}


def launch(name, fn, cell=None):
    """Run fn with config CONFIGS[name] (maxnreg applied by swapping the module's kernel; a
    "stage" by making the SPLIT kernels it does not keep no-ops; "parts" by overriding
    configs.PARTS_LAUNCH)."""
    cfg = dict(CONFIGS[name])
    cap = cfg.pop("maxnreg", None)
    stage = cfg.pop("stage", None)
    parts = cfg.pop("parts", {})
    if cfg.pop("v10_rule", 0):
        cfg.update(v10_rule(*(cell or (16, 128))))
    from bole_cli.kernels.configs import PARTS_LAUNCH

    homes = {k: importlib.import_module(m) for k, m in KERNEL_HOMES.items()}
    shipped = {k: getattr(homes[k], k) for k in SPLIT_KERNELS}
    shipped_parts = dict(PARTS_LAUNCH)
    if cap:  # (the cap applies to the blocked kernel only)
        homes["tree_verify_blocked_kernel"].tree_verify_blocked_kernel = Capped(
            shipped["tree_verify_blocked_kernel"], {"maxnreg": cap})
    keep, roles = STAGES[stage] if stage else (SPLIT_KERNELS, 7)
    for k in SPLIT_KERNELS:
        if k not in keep:
            setattr(homes[k], k, NoOp())
    PARTS_LAUNCH.update(parts, ROLES=roles)
    try:
        return fn(cfg)
    finally:
        for k, v in shipped.items():
            setattr(homes[k], k, v)
        PARTS_LAUNCH.clear()
        PARTS_LAUNCH.update(shipped_parts)


def check_configs(torch, tv, names, seed=0, dims=(16, 32, 128, 128), sizes=(256, 256, 130, 1, 200, 65),
                  device="cuda"):
    """Every config against the float64 reference at the real shape; worst rel error: a
    forest of deep and shallow trees (no depth promise), then shallow trees only (depth <= 8,
    wide, roots) with their depth promised (the level kernel's case)."""
    rows = check_forest(torch, tv, names, seed, dims, sizes, ("random", "chain", "roots", "random", "wide", "chain"),
                        device, "")
    rows.update(check_forest(torch, tv, names, seed + 1, dims, sizes, ("random", "random", "wide", "random",
                                                                       "roots", "random"), device, "shallow/"))
    return rows


def check_forest(torch, tv, names, seed, dims, sizes, shapes, device, label):
    """check_configs on one forest (a depth promise when no tree is deeper than 8)."""
    import itertools

    from bole_cli.kernels.reference import gdn_gates_ref, tree_verify_ref
    from bole_cli.trees import random_tree

    rows = {}
    h, hv, kd, vd = dims
    parents = []
    r = random.Random(seed)
    for s, sh in zip(sizes, shapes):
        parents += list(random_tree(r, s, max_depth=8 if sh == "random" else None, shape=sh).parents)
    n = sum(sizes)
    cu = torch.tensor([0] + list(itertools.accumulate(sizes)), dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    for dtype, tol, which in ((torch.bfloat16, 1e-2, names), (torch.float32, 2e-3, names[:1])):
        q = torch.randn(n, h, kd, generator=gen).to(dtype)
        k = torch.randn(n, h, kd, generator=gen).to(dtype)
        v = torch.randn(n, hv, vd, generator=gen).to(dtype)
        a = (torch.randn(n, hv, generator=gen) * 2).to(dtype)
        b = torch.randn(n, hv, generator=gen).to(dtype)
        a_log = torch.rand(hv, generator=gen) * 2.0 - 1.0
        a_log[0] = math.log(30.0)  # head 0: decays down to about -30 per node
        dt_bias = torch.randn(hv, generator=gen)
        state = torch.randn(len(sizes) + 2, hv, vd, kd, generator=gen)
        slots = torch.randperm(len(sizes) + 2, generator=gen)[: len(sizes)].to(torch.int32)
        par = torch.tensor(parents, dtype=torch.int32)
        g, beta = gdn_gates_ref(a_log, a, dt_bias, b)
        ref = tree_verify_ref(q, k, v, g, beta, state, slots, par, cu)
        dev = [x.to(device) for x in (q, k, v, a, b, a_log, dt_bias, state, slots, par, cu)]
        depth = {} if "chain" in shapes else {"max_depth": 8}
        for name in (w for w in which if "stage" not in CONFIGS[w]):  # a stage alone is not exact
            def run(cfg):
                promise = {} if cfg.pop("no_depth", 0) else depth
                return tv.tree_verify_gated(*dev, check_trees=False, max_nodes=max(sizes), config=cfg, **promise)
            got = launch(name, run)
            err = max(rel(x, y) for x, y in zip(got, ref))
            rows[f"{label}{name}/{str(dtype)[6:]}"] = err
            print(f"check {label}{name:2s} {str(dtype)[6:]:8s} rel err {err:.2e} {'ok' if err <= tol else 'FAIL'}",
                  flush=True)
            if not err <= tol:
                raise SystemExit(f"config {name} is wrong at the real shape ({dtype}): rel err {err:.2e}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="an older tree_verify.py (a copy); default: the shipped "
                                       "blocked kernel by its rule for every tree (CHAIN 0)")
    ap.add_argument("--batch", default="1,4,16,64")
    ap.add_argument("--nodes", default="128,192,256")
    ap.add_argument("--trees", default="random,chain")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--cells", help="tree:BxT list instead of the trees x batch x nodes grid, "
                                    "e.g. random:16x128,chain:1x256")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 checks (each cell still "
                                                            "compares every config with the baseline)")
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--eager", type=int, default=0, help="instead of timing, launch each config N times "
                                                          "without graphs (for ncu)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    import torch
    import triton

    from bole_cli import kernels
    from bole_cli.bench.kernel_bench import floor_bytes as _floor_bytes  # the bench's floor
    from bole_cli.catalog.models import resolve_model
    from bole_cli.kernels.reference import VerifyResult
    from bole_cli.timing import ROTATE, LayerInputs, time_graph, warm_gpu

    tv = importlib.import_module("bole_cli.kernels.tree_verify")
    old = load_module(args.baseline, "old_tree_verify") if args.baseline else tv
    old_cfg = None if args.baseline else {"CHAIN": 0, "LEVELS": 0}
    names = [c for c in args.configs.split(",") if c]
    t0 = time.time()
    checks = {} if args.no_check else check_configs(torch, tv, names)
    print(f"checks done in {time.time() - t0:.0f} s", flush=True)
    spec = resolve_model("9b")
    warm_gpu(torch)
    bw = 4.22e12  # the bench's measured copy bandwidth on this H200 (NOTES.md)
    rows = []
    if args.cells:
        cells = [(c.split(":")[0], *map(int, c.split(":")[1].split("x"))) for c in args.cells.split(",")]
    else:
        cells = [(t, b, nd) for t in args.trees.split(",") for b in map(int, args.batch.split(","))
                 for nd in map(int, args.nodes.split(","))]
    for tree, batch, nodes in cells:
        sets = [LayerInputs(torch, spec, batch, nodes, tree, 1000 * i + batch * 7 + nodes, torch.bfloat16,
                            torch.float32, sglang_buffers=False) for i in range(ROTATE)]
        n, hv, vd = batch * nodes, spec.gdn_value_heads, spec.gdn_value_dim
        outs = [VerifyResult(torch.empty_like(s.v), torch.empty(n, hv, vd, device="cuda"),
                             torch.empty(n, hv, device="cuda")) for s in sets]

        def verify(mod, cfg):
            no_depth = (cfg or {}).pop("no_depth", 0)
            depth = {} if (args.baseline and mod is old) or no_depth else {"max_depth": sets[0].max_depth}
            return [lambda s=s, o=o: mod.tree_verify_gated(
                s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents, s.cu,
                check_trees=False, max_nodes=nodes, out=o, config=cfg, **depth) for s, o in zip(sets, outs)]
        row = {"tree": tree, "batch": batch, "nodes": nodes,
               "floor_us": _floor_bytes(sets[0], spec) / bw * 1e6}
        fns = verify(old, old_cfg)
        fns[0]()
        want = [x.float().clone() for x in outs[0]]
        if args.eager:  # for a profiler (ncu): plain launches, no graphs, no timing
            torch.cuda.synchronize()
            for name in ["baseline"] + names:
                cfg = old_cfg if name == "baseline" else CONFIGS[name]
                for _ in range(args.eager):
                    verify(old if name == "baseline" else tv, cfg)[0]()
                torch.cuda.synchronize()
            continue
        row["old_us"] = time_graph(torch, fns, rep_ms=args.rep_ms)
        for name in names:
            def run(cfg):
                f = verify(tv, cfg)
                f[0]()
                diff = max(rel(a, b) for a, b in zip(outs[0], want))
                return diff, time_graph(torch, f, rep_ms=args.rep_ms)
            try:
                row[f"{name}_diff"], row[f"{name}_us"] = launch(name, run, (batch, nodes))
            except Exception as exc:  # a config that does not compile: note it, go on
                row[f"{name}_err"] = str(exc)[:200]
                print(f"  {name}: {exc!r}"[:300], flush=True)
        commit = [lambda s=s, o=o: kernels.tree_commit(s.pool, s.slots, s.k, o.u, o.log_p, s.parents, s.cu,
                                                      s.accepted, check_trees=False)
                  for s, o in zip(sets, outs)]
        row["commit_us"] = time_graph(torch, commit, rep_ms=args.rep_ms)
        best = min([(row[f"{c}_us"], c) for c in names if f"{c}_us" in row] or [(math.nan, "-")])
        row["best"] = best[1]
        rows.append(row)
        print(f"{tree:6s} B{batch:3d} T{nodes:3d} floor {row['floor_us']:7.1f} old {row['old_us']:8.1f} "
              + " ".join(f"{c} {row.get(c + '_us', math.nan):7.1f}" for c in names)
              + f" | commit {row['commit_us']:6.1f} best {best[1]} {best[0]:.1f} "
              f"x{(best[0] + row['commit_us']) / max(row['floor_us'], 8.0):.2f}", flush=True)
        del sets, outs, fns
        torch.cuda.empty_cache()
        if args.out:  # after every cell, so a cut run keeps what it measured
            with open(args.out + ".tmp", "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "command": "python " + " ".join(sys.argv),
                           "configs": CONFIGS, "checks": checks, "bandwidth": bw, "rows": rows}, f, indent=1)
            os.replace(args.out + ".tmp", args.out)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
