"""The skinny GEMM (kernels/skinny_mm.py) against cuBLAS at a decode step's projections:
does it stream the weights faster, at which shapes and rows, and with which launch?

For each catalogue model, every weight a decode step reads (bole_cli.runtime.model.
param_shapes: the GDN in_proj and out_proj, the attention's qkv and o projections, the MLP's
gate_up and down, the LM head) at M = --rows: cuBLAS as the runtime calls it (F.linear),
skinny_mm with its default rule (kernels.configs.skinny_mm_launch_config), and, at --grid-rows,
a grid of launches (BN x BK x SPLIT_K x stages). Each is checked against cuBLAS (relative
error within bf16's rounding) before it is timed. And the projections that read a layer's
normed rows (in_proj, qkv, gate_up, the LM head) as the production step runs them (compiled
add + RMSNorm, cuBLAS, the compiled SwiGLU after gate_up) against skinny_mm with those fused. Per model the step's GEMM time (each shape
times the layers that have it) by cuBLAS, by the rule, and by the fastest of cuBLAS and every
launch a shape (best_ms): the decode step's saving if the runtime took the kernel
(HybridModel(skinny_mm=True)) with the rule, or with a per-shape choice.

    PYTHONPATH=. python experiments/skinny_mm_bench.py --out /tmp/skinny-h200.json
    PYTHONPATH=. python experiments/skinny_mm_bench.py --smoke --out /tmp/s.json   # CPU, interpreter
    PYTHONPATH=. python experiments/skinny_mm_bench.py --shapes lm_head32k:32768:4096 --rows 1 --out F

Timing: CUDA graph replays (median; bole_cli.timing.time_graph), weights and inputs random,
--rotate weight sets a call so no replay reads a weight from L2. Index: experiments/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time

GRID = {"BN": (16, 32, 64), "BK": (128, 256), "SPLIT_K": (1, 2, 4, 8), "num_stages": (4,)}


def decode_gemms(spec) -> dict[str, tuple[int, int, int]]:
    """(N, K, GEMMs a decode step) of every projection, by name."""
    from bole_cli.runtime.model import param_shapes

    shapes = param_shapes(spec)
    out = {"lm_head": (*shapes["model"].get("lm_head", (spec.vocab, spec.hidden)), 1)}
    for name in ("in_proj", "out_proj"):
        out["gdn_" + name] = (*shapes["gdn"][name], spec.n_gdn_layers)
    for name in ("qkv_proj", "o_proj"):
        out["attn_" + name] = (*shapes["attn"][name], spec.n_attention_layers)
    if not spec.is_moe:
        for name in ("gate_up", "down"):
            out["mlp_" + name] = (*shapes["mlp"][name], spec.layers)
    return {k: v for k, v in out.items() if v[2]}


def timed(torch, fns, cuda: bool, rep_ms: int) -> float:
    """Microseconds a call (one call a fn): graph replay on CUDA, the wall clock on CPU."""
    if cuda:
        from bole_cli.timing import time_graph

        return time_graph(torch, fns, rep_ms=rep_ms)
    t0 = time.perf_counter()
    for f in fns:
        f()
    return (time.perf_counter() - t0) * 1e6 / len(fns)


def bench_shape(torch, name, n, k, rows, grid_rows, device, dtype, rotate, rep_ms, copy_bw, configs) -> list[dict]:
    import torch.nn.functional as F

    from bole_cli.kernels.configs import launch_config
    from bole_cli.kernels.skinny_mm import skinny_mm

    cuda = device == "cuda"
    weights = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(rotate)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 132
    out = []
    for m in rows:
        xs = [torch.randn(m, k, device=device, dtype=dtype) for _ in range(rotate)]
        want = F.linear(xs[0], weights[0]).float()
        moved = (n * k + m * k + m * n) * torch.finfo(dtype).bits // 8

        def row(impl, cfg, us, err):
            return {"gemm": name, "N": n, "K": k, "M": m, "impl": impl, "config": cfg, "us": us, "rel_err": err,
                    "bw_fraction_of_copy": moved / (us * 1e-6) / copy_bw if copy_bw else None}

        cublas = timed(torch, [lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, weights)], cuda, rep_ms)
        out.append(row("cublas", None, cublas, 0.0))
        rule = launch_config("skinny_mm", {"M": m, "N": n, "K": k, "SMS": sms})
        tries = [("rule", rule)] + ([("grid", dict(zip(GRID, v), num_warps=4)) for v in configs]
                                    if m in grid_rows else [])
        for impl, cfg in tries:
            try:  # a grid launch may exceed the GPU (shared memory): recorded, never fatal
                got = skinny_mm(xs[0], weights[0], config=cfg).float()
            except Exception as exc:  # noqa: BLE001 - triton's OutOfResources and the like
                out.append(row(impl, cfg, float("nan"), float("nan")) | {"error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            err = float((got - want).norm() / want.norm().clamp(min=1e-30))
            if err > 4e-3:  # not the same product: never timed
                out.append(row(impl, cfg, float("nan"), err))
                continue
            us = timed(torch, [lambda x=x, w=w, c=cfg: skinny_mm(x, w, config=c) for x, w in zip(xs, weights)],
                       cuda, rep_ms)
            out.append(row(impl, cfg, us, err))
        best = min((r for r in out if r["M"] == m and r["impl"] != "cublas" and r["us"] == r["us"]),
                   key=lambda r: r["us"], default=None)
        print(f"{name:14s} N {n:6d} K {k:6d} M {m:3d}: cuBLAS {cublas:7.1f} us  rule "
              f"{out[-len(tries)]['us']:7.1f}  best {best['us'] if best else float('nan'):7.1f} "
              f"({sum('error' in r for r in out[-len(tries):])} launches refused) "
              f"{best['config'] if best else ''}", flush=True)
    del weights
    return out


FUSED = {"gdn_in_proj": False, "attn_qkv_proj": False, "mlp_gate_up": True, "lm_head": False}  # name: glu


def bench_fused(torch, name, n, k, rows, device, dtype, rotate, rep_ms, glu) -> list[dict]:
    """A projection the runtime feeds with a layer's NormedRows: the residual add + RMSNorm
    compiled (Fusion.add_rms, one launch) then cuBLAS (then the compiled SwiGLU for gate_up),
    as the production step runs it, against skinny_mm with the add, the norm (and SwiGLU)
    fused, its rule's launch. Checked against each other before timing."""
    import torch.nn.functional as F

    from bole_cli.kernels.skinny_mm import skinny_mm
    from bole_cli.runtime.fusion import RMS_EPS, Fusion

    cuda = device == "cuda"
    fuse = Fusion(compile=cuda)
    weights = [torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5 for _ in range(rotate)]
    norm = 1 + torch.randn(k, device=device, dtype=dtype) / 8
    out = []
    for m in rows:
        xs = [torch.randn(m, k, device=device, dtype=dtype) for _ in range(rotate)]
        ys = [torch.randn(m, k, device=device, dtype=dtype) for _ in range(rotate)]
        total = torch.empty(m, k, device=device, dtype=dtype)

        def unfused(x, y, w):
            h = fuse.add_rms(x, y, norm)[1]
            return fuse.swiglu(F.linear(h, w)) if glu else F.linear(h, w)

        def fused(x, y, w):
            return skinny_mm(x, w, residual=y, norm=norm, eps=RMS_EPS, sum_out=total, glu=glu)

        want = unfused(xs[0], ys[0], weights[0]).float()
        got = fused(xs[0], ys[0], weights[0]).float()
        err = float((got - want).norm() / want.norm().clamp(min=1e-30))
        t = {}
        for impl, fn in (("unfused", unfused), ("fused", fused)):
            t[impl] = (timed(torch, [lambda x=x, y=y, w=w: fn(x, y, w) for x, y, w in zip(xs, ys, weights)], cuda,
                             rep_ms) if err <= 8e-3 else float("nan"))
            out.append({"gemm": name, "N": n, "K": k, "M": m, "impl": impl, "glu": glu, "us": t[impl], "rel_err": err})
        print(f"{name:14s} N {n:6d} K {k:6d} M {m:3d}: add_rms + cuBLAS{' + SwiGLU' if glu else ''} "
              f"{t['unfused']:7.1f} us  fused {t['fused']:7.1f}  (rel err {err:.1e})", flush=True)
    del weights
    return out


def summary(rows: list[dict], gemms: dict) -> list[dict]:
    """Per M: the step's GEMM time by cuBLAS, by the rule and by the best launch a shape."""
    out = []
    for m in sorted({r["M"] for r in rows}):
        tot = {"cublas": 0.0, "rule": 0.0, "best": 0.0}
        for name, (_, _, count) in gemms.items():
            here = [r for r in rows if r["gemm"] == name and r["M"] == m and r["us"] == r["us"]]
            cub = next(r["us"] for r in here if r["impl"] == "cublas")
            rule = next((r["us"] for r in here if r["impl"] == "rule"), cub)
            tot["cublas"] += count * cub
            tot["rule"] += count * rule
            tot["best"] += count * min(r["us"] for r in here)
        out.append({"M": m, **{k + "_ms": v / 1e3 for k, v in tot.items()}})
    return out


def fused_summary(rows: list[dict], gemms: dict) -> list[dict]:
    """Per M: the step's normed projections (each times its layers), unfused against fused."""
    out = []
    for m in sorted({r["M"] for r in rows}):
        tot = {"unfused": 0.0, "fused": 0.0}
        for r in rows:
            if r["M"] == m:
                tot[r["impl"]] += gemms[r["gemm"]][2] * r["us"]
        out.append({"M": m, **{k + "_ms": v / 1e3 for k, v in tot.items()}})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="4b,9b,27b")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--grid-rows", default="1,16,64", help="rows at which the launch grid is timed too")
    ap.add_argument("--rotate", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=60)
    ap.add_argument("--shapes", default="", help="name:N:K,... instead of --models' projections (e.g. a "
                    "drafter level's: lm_head32k:32768:4096); no fused rows")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU under the interpreter (a test)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli.catalog.models import resolve_model, tiny_spec

    cuda = not args.smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    rows = [1, 3] if args.smoke else [int(r) for r in args.rows.split(",")]
    grid_rows = [1] if args.smoke else [int(r) for r in args.grid_rows.split(",")]
    configs = list(itertools.product(*GRID.values()))[:2] if args.smoke else list(itertools.product(*GRID.values()))
    copy_bw = None
    if cuda:
        from bole_cli.timing import measure_copy_bandwidth, warm_gpu

        warm_gpu(torch)
        copy_bw = measure_copy_bandwidth(torch)
    doc = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "versions": {"torch": torch.__version__, "python": platform.python_version()},
           "command": "python " + " ".join(sys.argv), "copy_bandwidth_bytes_s": copy_bw, "grid": GRID,
           "models": []}
    if cuda:
        import triton

        doc["versions"]["triton"] = triton.__version__

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    shapes = {}
    for item in filter(None, args.shapes.split(",")):
        name, n, k = item.split(":")
        shapes[name] = (int(n), int(k), 1)
    for name in (["tiny"] if args.smoke else ["shapes"] if shapes else args.models.split(",")):
        spec = tiny_spec(layers=4) if args.smoke else None if shapes else resolve_model(name)
        gemms = shapes or decode_gemms(spec)
        entry = {"model": "--shapes" if shapes else spec.name, "gemms": {k: list(v) for k, v in gemms.items()},
                 "rows": [], "step": []}
        doc["models"].append(entry)
        for g, (n, k, _) in gemms.items():
            entry["rows"] += bench_shape(torch, g, n, k, rows, grid_rows, device, dtype,
                                         1 if args.smoke else args.rotate, args.rep_ms, copy_bw, configs)
            save()
        entry["fused"] = []
        for g, glu in FUSED.items():
            if g in gemms and not shapes:
                n, k, _ = gemms[g]
                entry["fused"] += bench_fused(torch, g, n, k, rows, device, dtype, 1 if args.smoke else args.rotate,
                                              args.rep_ms, glu)
                save()
        entry["step"] = summary(entry["rows"], gemms)
        entry["fused_step"] = fused_summary(entry["fused"], gemms)
        save()
    print(f"\n{'model':16s} {'M':>3s} {'cuBLAS ms':>10s} {'rule ms':>8s} {'best ms':>8s}")
    for entry in doc["models"]:
        for s in entry["step"]:
            print(f"{entry['model']:16s} {s['M']:3d} {s['cublas_ms']:10.3f} {s['rule_ms']:8.3f} {s['best_ms']:8.3f}")
    print(f"\n{'model':16s} {'M':>3s} {'normed projections, unfused ms':>31s} {'fused ms':>9s}")
    for entry in doc["models"]:
        for s in entry["fused_step"]:
            print(f"{entry['model']:16s} {s['M']:3d} {s['unfused_ms']:31.3f} {s['fused_ms']:9.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
