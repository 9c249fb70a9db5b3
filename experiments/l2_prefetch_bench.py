"""Does streaming the next GEMM's weights into L2 beside a layer's latency-bound kernels cut
a decode? (experiments/NOTES.md "Weights into L2 beside the mixer".)

At one row a 4096 x 4096 projection (the GDN out_proj, the attention o_proj) streams at about
half the copy rate: a GEMM this small is mostly its ramp. Before it, the mixer (the fused GDN
decode, ~10 us at batch 1) reads 2 MB and leaves HBM idle. Here, per layer: the fused GDN
decode, then out_proj (F.linear, as the runtime calls it), with the weight either read cold
("plain") or first pulled into L2 on a side stream forked before the decode and joined
before the GEMM, by the kernel here in one of its modes ("bulk": sm_90's
cp.async.bulk.prefetch.L2, 64 KB a lane; "line": prefetch.global.L2::evict_last, a 128-byte
line a lane), its grid either one lane a step ("full") or capped at --programs programs that
loop over the lanes, so the mixer's programs still find SMs beside it.
Layers rotate (enough that their weights pass 5x the L2) so no replay finds a weight left
there. Also timed alone: the decode, the GEMM, each prefetch. Outputs are checked equal to
the plain order's (the prefetch changes no value).

    python experiments/l2_prefetch_bench.py --models 9b,4b,27b --batch 1,4 --out l2.json

Index of experiments: experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch
import triton
import triton.language as tl

CHUNK = 64 * 1024  # bytes one bulk prefetch names
LINE = 128  # bytes one line prefetch names
BLOCK = 128  # lanes a program a step
MODES = ("bulk", "line")


@triton.jit
def l2_prefetch_kernel(t, n_bytes, steps, BULK: tl.constexpr, BLOCK: tl.constexpr, STEP: tl.constexpr):
    """Program p names lanes p, p + P, ... (P programs, `steps` of them each); lane i names
    bytes [i STEP, (i + 1) STEP) of t, clipped to n_bytes, so nothing past the tensor."""
    base = t.to(tl.pointer_type(tl.int8))
    for i in range(steps):
        lane = (i * tl.num_programs(0) + tl.program_id(0)) * BLOCK + tl.arange(0, BLOCK)
        offs = lane.to(tl.int64) * STEP
        size = tl.minimum(n_bytes - offs, STEP).to(tl.int32)
        size = tl.where(size > 0, size, 0)
        ptr = base + tl.where(size > 0, offs, 0)
        if BULK:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
                "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)


def launch_plan(n_bytes: int, address: int, mode: str, programs: int | None) -> tuple[bool, int, int, int]:
    """(bulk, bytes a lane, programs, steps a program) naming n_bytes from `address`: bulk
    where address and length are multiples of 16 (cp.async.bulk's rule), else lines; at most
    `programs` programs (None: one step each)."""
    bulk = mode == "bulk" and address % 16 == 0 and n_bytes % 16 == 0
    step = CHUNK if bulk else LINE
    blocks = triton.cdiv(triton.cdiv(n_bytes, step), BLOCK)
    grid = blocks if programs is None else max(1, min(programs, blocks))
    return bulk, step, grid, triton.cdiv(blocks, grid)


def l2_prefetch(t: torch.Tensor, mode: str = "line", programs: int | None = None) -> None:
    """Hint t's bytes into L2 on the current stream (t contiguous, on the GPU)."""
    n = t.numel() * t.element_size()
    bulk, step, grid, steps = launch_plan(n, t.data_ptr(), mode, programs)
    l2_prefetch_kernel[(grid,)](t, n, steps, BULK=bulk, BLOCK=BLOCK, STEP=step, num_warps=BLOCK // 32)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="9b")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--modes", default="line-full,line-16,line-32,bulk-16",
                    help="MODE-full (one lane a step) or MODE-N (N programs looping), MODE one of bulk, line")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import functools

    from component_bench import decode_call, decode_layer

    from bole_cli.catalog.models import resolve_model
    from bole_cli.runtime import gdn_ops
    from bole_cli.timing import capture_graph, replay_ms, warm_gpu

    def plan(name):  # "line-16" -> ("line", 16); "line-full" -> ("line", None)
        mode, programs = name.split("-")
        return mode, None if programs == "full" else int(programs)

    warm_gpu(torch)
    dev, dt = "cuda", torch.bfloat16
    ops = gdn_ops.GDNOps("kernels", torch.device(dev))
    doc = {"device": torch.cuda.get_device_name(), "versions": {"torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version()}, "command": "python " + " ".join(sys.argv), "rows": []}
    side = torch.cuda.Stream()
    for name in args.models.split(","):
        s = resolve_model(name)
        hv, dv = s.gdn_value_heads, s.gdn_value_dim
        w_bytes = s.hidden * hv * dv * 2
        layers = max(8, -(-int(5 * 50e6) // w_bytes))
        for b in (int(x) for x in args.batch.split(",")):
            sets = []
            for _ in range(layers):  # a GDN layer's decode inputs, and its out_proj
                t = decode_layer(torch, s, b, dev, dt)
                t.update(w=torch.randn(s.hidden, hv * dv, device=dev, dtype=dt) * (hv * dv) ** -0.5,
                         y=torch.empty(b, s.hidden, device=dev, dtype=dt),
                         o_in=torch.randn(b, hv * dv, device=dev, dtype=dt))
                t["decode"] = decode_call(ops, s, t)
                sets.append(t)

            def layer(t, mode=None):
                def run():
                    if mode is not None:
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            l2_prefetch(t["w"], *plan(mode))
                    o = t["decode"]()
                    if mode is not None:
                        torch.cuda.current_stream().wait_stream(side)
                    torch.mm(o, t["w"].t(), out=t["y"])
                return run

            def timed(fns):
                g = capture_graph(torch, fns)
                return replay_ms(g, 300, warmup_ms=100) * 1e3 / layers

            # values: the plain order against each prefetch (same states: fresh copies)
            keep = [(t["state"].clone(), t["conv"].clone()) for t in sets]

            def outputs(mode):
                for t, (st, cv) in zip(sets, keep):
                    t["state"].copy_(st)
                    t["conv"].copy_(cv)
                for t in sets:
                    layer(t, mode)()
                torch.cuda.synchronize()
                return torch.stack([t["y"].clone() for t in sets])

            want = outputs(None)
            row = {"model": s.name, "batch": b, "layers": layers, "weight_mb": w_bytes / 1e6,
                   "decode_us": timed([t["decode"] for t in sets]),
                   "gemm_us": timed([functools.partial(torch.mm, t["o_in"], t["w"].t()) for t in sets]),
                   "plain_us": timed([layer(t) for t in sets])}
            for mode in args.modes.split(","):
                row[f"prefetch_{mode}_alone_us"] = timed([functools.partial(l2_prefetch, t["w"], *plan(mode))
                                                          for t in sets])
                row[f"{mode}_us"] = timed([layer(t, mode) for t in sets])
                row[f"{mode}_equal"] = bool(torch.equal(outputs(mode), want))
            doc["rows"].append(row)
            print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
