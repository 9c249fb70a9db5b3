"""Component microbenchmarks for the roofline estimate's efficiency factors (calibrate's
costmodel.Efficiency), measured on the GPU and never fitted to a profile's end results:

- weight streaming and GEMM rate against rows: F.linear(x [M, K], W [N, K]) at a catalogue
  model's projection shapes (the fused GDN in_proj, the MLP's gate_up and down, the LM head)
  for M = --rows; bytes read / time against the measured copy bandwidth, FLOP/s against
  the datasheet bf16 peak (bole_cli.catalog.hardware), so each row gives both fractions;
- the per-kernel floor: --chain tiny elementwise kernels back to back in one CUDA graph,
  time / kernels;
- the host step: a tiny kernel and the host read of its result (`.item()`, the sync a
  sampled token's trip to the host costs), eager;
- the runtime's small kernels at decode rows: the compiled residual add + RMSNorm and
  SwiGLU (runtime.fusion), back to back in one graph, time per call: what a row-reduction
  or elementwise kernel of a layer costs where the trivial floor above does not apply;
- the fused one-token GDN decode (GDNOps.decode, called as the runtime's decode calls it:
  in_proj's output columns as views, every request's state and conv window in place) at
  each --decode-batch, --rotate layers' states timed together: the estimate's share of its
  roofline for a decode's GDN layer by batch (calibrate.components.gdn_decode_cells);
- a full-attention layer's attention over the KV cache (kernels.cache_attention, as the
  runtime's decode and verify call it) at each batch, cache length and tokens a request:
  the estimate's attention share by keys read and query rows (components.attention_cells); and
  at 2-8 tokens also as the drafter's level calls it (its rows stacked with the query
  group, no tree mask: components.attention_cells(..., drafter=True)).

Sweeps beside the runtime's own calls: --decode-launches (the GDN decode's value split x
warps), --attention-launches (cache_attention's launch knobs), --decode-variants and
--attention-variants (experiments/kernel_variants.py's edits in place), --sglang (SGLang's
own GDN decode of a layer, its gated norm counted). Their rows carry the launch or variant;
calibrate.components leaves them out of the estimate's factors.

    python experiments/component_bench.py --model 9b --out experiments/results/components/h200-9b.json
    python experiments/component_bench.py --device cpu --smoke --out /tmp/c.json   # CPU smoke (no timings to quote)

Timing: CUDA graph replays (median; bole_cli.timing), weights and inputs random, a fresh
weight per rotated input set so no replay reads a weight from L2. Index of experiments:
experiments/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time


def projection_shapes(spec) -> dict[str, tuple[int, int]]:
    """(N, K) of the GEMMs one decode step streams, by name."""
    s = spec
    conv_dim = 2 * s.gdn_key_heads * s.gdn_key_dim + s.gdn_value_heads * s.gdn_value_dim
    in_proj = conv_dim + s.gdn_value_heads * s.gdn_value_dim + 2 * s.gdn_value_heads
    shapes = {"gdn_in_proj": (in_proj, s.hidden), "lm_head": (s.vocab, s.hidden)}
    if s.ffn:
        shapes.update(mlp_gate_up=(2 * s.ffn, s.hidden), mlp_down=(s.hidden, s.ffn))
    return shapes


def time_us(torch, fns, cuda: bool, calls: int) -> float:
    """Microseconds per call of fns (one call each): graph replay on CUDA, the wall clock
    on CPU (smoke only)."""
    if cuda:
        from bole_cli.timing import time_graph

        return time_graph(torch, fns, calls=calls)
    t = []
    for _ in range(3):
        t0 = time.perf_counter()
        for f in fns:
            f()
        t.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(t)


def gemm_rows(torch, spec, rows, device, dtype, rotate: int, peak_flops: float, copy_bw: float) -> list[dict]:
    import torch.nn.functional as F

    cuda = device == "cuda"
    out = []
    for name, (n, k) in projection_shapes(spec).items():
        weights = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(rotate)]
        for m in rows:
            xs = [torch.randn(m, k, device=device, dtype=dtype) for _ in range(rotate)]
            fns = [lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, weights)]  # as the runtime calls it
            us = time_us(torch, fns, cuda, len(fns))
            size = torch.finfo(dtype).bits // 8
            moved = (n * k + m * k + m * n) * size
            flops = 2.0 * m * n * k
            out.append({"gemm": name, "N": n, "K": k, "M": m, "us": us,
                        "bytes": moved, "bw_fraction_of_copy": moved / (us * 1e-6) / copy_bw if copy_bw else None,
                        "flops_fraction_of_peak": flops / (us * 1e-6) / peak_flops if peak_flops else None})
            print(f"{name:12s} M {m:5d}: {us:9.1f} us", flush=True)
        del weights
    return out


def kernel_floor(torch, device, chain: int) -> dict:
    cuda = device == "cuda"
    x = torch.randn(256, device=device)
    fns = [lambda: x.mul_(1.0000001) for _ in range(chain)]
    return {"kernels": chain, "us_per_kernel": time_us(torch, fns, cuda, chain)}


def small_kernels(torch, spec, device, dtype, rows, chain: int) -> list[dict]:
    from bole_cli.runtime.fusion import Fusion

    cuda = device == "cuda"
    fuse = Fusion(cuda)
    out = []
    for m in rows:
        x = torch.randn(m, spec.hidden, device=device, dtype=dtype)
        y = torch.randn(m, spec.hidden, device=device, dtype=dtype)
        w = torch.randn(spec.hidden, device=device, dtype=dtype)
        gu = torch.randn(m, 2 * (spec.ffn or spec.shared_expert_ffn or spec.hidden), device=device, dtype=dtype)
        for name, fn in (("add_rms", lambda: fuse.add_rms(x, y, w)), ("swiglu", lambda: fuse.swiglu(gu))):
            fn()  # compile outside the graph
            out.append({"kernel": name, "rows": m, "us": time_us(torch, [fn] * chain, cuda, chain)})
    return out


PARTS = ("gemms", "kernel_floor", "host_step", "small_kernels", "gdn_decode", "attention")  # in run order
DECODE_LAUNCHES = "1x8,2x4,4x2,4x4,8x1,8x2,8x4,16x1,16x2"  # value split x warps (kernels.gdn_decode)


def decode_layer(torch, spec, b: int, device, dtype) -> dict:
    """One GDN layer's decode inputs at batch b, as the runtime holds them: in_proj's output
    as column views (x, z, b, a), the conv windows, the layer's conv weight, gates and norm
    weight, the float32 states (the factor dtype) and the requests' slots."""
    from bole_cli.runtime import gdn_ops
    from bole_cli.runtime.model import gdn_proj_width

    s, fdt = spec, gdn_ops.factor_dtype(dtype)
    hv, dk, dv, cd = s.gdn_value_heads, s.gdn_key_dim, s.gdn_value_dim, s.conv_dim
    proj = torch.randn(b, gdn_proj_width(s), device=device, dtype=dtype)
    return dict(x=proj[:, :cd], z=proj[:, cd: cd + hv * dv], b=proj[:, cd + hv * dv: cd + hv * dv + hv],
                a=proj[:, cd + hv * dv + hv:],
                conv=torch.randn(gdn_ops.conv_state_shape(b, cd, s.conv_kernel), device=device, dtype=dtype),
                conv_w=torch.randn(cd, s.conv_kernel, device=device, dtype=dtype) * s.conv_kernel ** -0.5,
                a_log=torch.rand(hv, device=device, dtype=fdt),
                dt_bias=torch.full((hv,), -2.0, device=device, dtype=fdt),
                norm_w=torch.randn(dv, device=device, dtype=dtype),
                state=torch.randn(b, hv, dv, dk, device=device, dtype=fdt) * 0.1,
                slots=torch.arange(b, device=device, dtype=torch.int64))


def decode_call(ops, spec, t: dict, launch=(None, None)):
    """The fused decode of layer `t` (decode_layer) as the runtime calls it, at `launch`
    (value split, warps; None: the kernel's rule)."""
    import functools

    from bole_cli.runtime.fusion import RMS_EPS

    return functools.partial(ops.decode, t["x"], t["conv"], t["conv_w"], None, t["a"], t["b"], t["a_log"],
                             t["dt_bias"], t["state"], t["slots"], key_heads=spec.gdn_key_heads, z=t["z"],
                             norm_w=t["norm_w"], eps=RMS_EPS, value_split=launch[0], num_warps=launch[1])


def gdn_decode_rows(torch, spec, batches, device, dtype, rotate: int, rotate_bytes: float = 0.0,
                    launches=((1, 8), (2, 4), (4, 2)), sglang=None, variants=()) -> list[dict]:
    """Microseconds a GDN layer's fused decode takes at each batch (one token a request) and
    launch (kernels.gdn_decode's value_split x num_warps; splits that leave fewer than 8
    value rows a program are skipped), over at least `rotate` layers and enough of them that
    their states pass rotate_bytes (several times the L2, so no replay finds a state there).
    Each launch's state and output after one step agree with the first launch's
    (max_rel_state, max_rel_out). With `sglang` (bole_cli.sglang's kernels) also SGLang's own
    decode of a layer as its CUDA path calls it, impl "sglang": causal_conv1d_update on the
    contiguous q|k|v rows, then the packed recurrent decode (its gated norm, a third
    launch, counted when `sglang` has it: load_sglang_kernels(with_norm=True); its split of
    in_proj's output into contiguous rows, a launch too, is not), its state (and with the
    norm its output) checked against ours. `variants`: names of
    experiments/kernel_variants.py's decode variants, each timed at every launch (rows with
    "variant"), its step checked against the shipped kernel's at the same launch."""
    from kernel_variants import DECODE, kernel_in_place, load_variant

    from bole_cli.kernels._env import interpreting
    from bole_cli.runtime import gdn_ops
    from bole_cli.runtime.fusion import RMS_EPS

    s, cuda = spec, device == "cuda"
    # the kernel on the GPU, and under the interpreter on CPU (a smoke run of the launches)
    ops = gdn_ops.GDNOps("kernels" if cuda or interpreting() else "auto", torch.device(device))
    fdt = gdn_ops.factor_dtype(dtype)
    hv, dk, dv = s.gdn_value_heads, s.gdn_key_dim, s.gdn_value_dim
    out = []
    vp = 1 << (dv - 1).bit_length()
    contenders = [(None, None)] + [(name, load_variant(name)) for name in variants]  # None: the shipped kernel

    def ours(t, launch):
        return decode_call(ops, s, t, launch)

    def theirs(t):
        # SGLang's split kernel (not timed) hands the conv contiguous q|k|v rows and z
        x, z = t["x"].contiguous(), t["z"].contiguous().view(-1, dv)
        a, b = t["a"], t["b"]
        o = x.new_empty(x.shape[0], 1, hv, dv)

        def call():
            mixed = sglang.causal_conv1d_update(x, t["conv"], t["conv_w"], None, "silu",
                                                conv_state_indices=t["slots"])
            sglang.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=mixed, a=a, b=b, A_log=t["a_log"], dt_bias=t["dt_bias"], scale=dk ** -0.5,
                initial_state=t["state"], out=o, ssm_state_indices=t["slots"], use_qk_l2norm_in_kernel=True)
            if sglang.layernorm_fn is None:
                return o
            return sglang.layernorm_fn(o.view(-1, dv), t["norm_w"], None, z=z, eps=RMS_EPS, group_size=None,
                                       norm_before_gate=True, is_rms_norm=True, activation="swish").view(-1, hv * dv)
        return call

    def rel(got, want):
        return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))

    def after_one_step(t, fn_of):  # (state, output) of one step on copies of a layer
        c = {k: (v.clone() if k in ("conv", "state") else v) for k, v in t.items()}
        o = fn_of(c)()
        return c["state"], o

    for b in batches:
        layers = max(rotate, -(-int(rotate_bytes) // (b * hv * dk * dv * fdt.itemsize)))
        sets = [decode_layer(torch, s, b, device, dtype) for _ in range(layers)]
        ok = [ln for ln in launches if vp // ln[0] >= 8]
        # every contender's step (and SGLang's) from the same states, before any timing moves them
        steps = {}
        for name, kernel in contenders:
            with kernel_in_place(DECODE, kernel) if name else contextlib.nullcontext():
                for launch in ok:
                    steps[name, launch] = after_one_step(sets[0], lambda c, launch=launch: ours(c, launch))
        if sglang is not None:
            steps["sglang"] = after_one_step(sets[0], theirs)
        ref_state, ref_out = steps[None, ok[0]]
        for name, kernel in contenders:  # the shipped kernel against its first launch, a variant its own
            with kernel_in_place(DECODE, kernel) if name else contextlib.nullcontext():
                for launch in ok:
                    (state, o), (want_state, want_out) = steps[name, launch], steps[None, launch if name else ok[0]]
                    fns = [ours(t, launch) for t in sets]
                    fns[0]()  # compile (and the split counters) outside the graph
                    row = {"batch": b, "impl": "bole", **({"variant": name} if name else {}),
                           "value_split": launch[0], "num_warps": launch[1], "layers": layers,
                           "us": time_us(torch, fns, cuda, layers), "max_rel_state": rel(state, want_state),
                           "max_rel_out": rel(o, want_out)}
                    out.append(row)
                    print(f"gdn decode b {b:3d} split {launch[0]:2d} warps {launch[1]} {name or ''}: "
                          f"{row['us']:7.2f} us", flush=True)
        if sglang is not None:
            state, _ = steps["sglang"]
            fns = [theirs(t) for t in sets]
            fns[0]()
            row = {"batch": b, "impl": "sglang", "layers": layers, "us": time_us(torch, fns, cuda, layers),
                   "max_rel_state": rel(state, ref_state), "norm": sglang.layernorm_fn is not None}
            if sglang.layernorm_fn is not None:
                row["max_rel_out"] = rel(steps["sglang"][1], ref_out)
            out.append(row)
            print(f"gdn decode b {b:3d} sglang (conv + packed decode{' + norm' * row['norm']}): {row['us']:7.2f} us",
                  flush=True)
        del sets
    return out


def attention_rows(torch, spec, batches, kvs, tokens, device, dtype, rotate: int, rotate_bytes: float = 0.0,
                   launches=(None,), variants=()) -> list[dict]:
    """Microseconds one full-attention layer's attention over the KV cache takes, as the
    runtime calls it (kernels.cache_attention): a decode's one row a request (tokens 1,
    form "decode") or a verify's `tokens` tree tokens a request (q token-major, the tree's
    keys after the cache under a chain's mask, the forest's offsets: form "tree"), and at 2-8
    tokens the drafter's level (bench/drafter.py: the level's rows stacked with the query
    group, every row reading the cache and the level's keys, no mask: form "drafter"), at
    each batch and cache length; enough layers' caches rotated that they pass rotate_bytes.
    `launches`: cache_attention's launch knobs to time (None: its default), each row checked
    against the first launch's output; `variants`: experiments/kernel_variants.py's attention
    variants, each at the default launch (rows with "variant"), checked likewise.
    The estimate's attention shares by keys read and query rows (tokens x group)
    (calibrate.components.attention_cells)."""
    import functools

    from kernel_variants import ATTENTION, kernel_in_place, load_variant

    from bole_cli.runtime.attention import cache_attention

    contenders = [(launch, None, None) for launch in launches] + [
        (None, name, load_variant(name)) for name in variants]
    hkv, grp, d = spec.attn_kv_heads, spec.attn_group, spec.attn_head_dim
    out = []
    for b in batches:
        for kv in kvs:
            for n in tokens:
                forms = ["decode"] if n == 1 else ["tree", "drafter"] if n <= DRAFTER_TOKENS else ["tree"]
                length = kv + (n if n > 1 else 0)
                layers = max(rotate, -(-int(rotate_bytes) // (2 * b * hkv * length * d * dtype.itemsize)))
                slots = torch.arange(b, device=device, dtype=torch.int64)
                for form in forms:
                    # the drafter's rows read the level's own keys too: its cache holds them
                    used = torch.full((b,), length if form == "drafter" else kv, device=device, dtype=torch.int64)
                    calls = [_attention_call(torch, cache_attention, form, b, n, hkv, grp, d, kv, length, slots,
                                             used, device, dtype) for _ in range(layers)]
                    want = None
                    for launch, name, kernel in contenders:
                        fns = [functools.partial(f, launch=launch) for f in calls]
                        with kernel_in_place(ATTENTION, kernel) if name else contextlib.nullcontext():
                            got = fns[0]()[0].float()  # compile outside the graph; the launches agree
                            us = time_us(torch, fns, device == "cuda", layers)
                        want = got if want is None else want
                        row = {"batch": b, "kv": kv, "tokens": n, "form": form, "layers": layers, "us": us}
                        if launch is not None or name:
                            row.update(max_rel_out=float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))
                        if launch is not None:
                            row["launch"] = list(launch)
                        if name:
                            row["variant"] = name
                        out.append(row)
                        print(f"attention b {b:2d} kv {kv:5d} tokens {n:2d} {form:7s} {name or launch}: {us:7.2f} us",
                              flush=True)
    return out


DRAFTER_TOKENS = 8  # the most rows a request a drafter level takes (its top-k beam)


def attention_max_keys(kv: int, tokens: int, form: str) -> int:
    """The bound on the keys read that a `form` call gives cache_attention (the runtime's, so
    the default launch is the runtime's): the cache, plus a tree's or drafter level's own
    keys (experiments/attention_rule.py judges the rule on it)."""
    return kv if form == "decode" else kv + tokens


def _attention_call(torch, cache_attention, form, b, n, hkv, grp, d, kv, length, slots, used, device, dtype):
    """One layer's cache_attention call of `form` on a fresh random cache (attention_rows)."""
    import functools

    k_cache, v_cache = (torch.randn(b, hkv, length, d, device=device, dtype=dtype) for _ in range(2))
    bound = attention_max_keys(kv, n, form)
    if form == "decode":
        q = torch.randn(b, hkv, grp, d, device=device, dtype=dtype)
        return functools.partial(cache_attention, q, k_cache, v_cache, slots, used, bound)
    if form == "drafter":  # bench/drafter.py's level: [b, hkv, rows x grp, d], no mask
        q = torch.randn(b, hkv, n * grp, d, device=device, dtype=dtype)
        return functools.partial(cache_attention, q, k_cache, v_cache, slots, used, bound)
    q = torch.randn(b, n, hkv, grp, d, device=device, dtype=dtype).transpose(1, 2)
    seen = torch.arange(n, device=device)[:, None] >= torch.arange(n, device=device)[None, :]
    bias = torch.zeros(n, n, device=device).masked_fill_(~seen, float("-inf"))
    bias = bias.repeat_interleave(grp, 0)[None, None].expand(b, 1, n * grp, n).contiguous()
    cu = torch.arange(0, b * n + 1, n, device=device, dtype=torch.int32)
    return functools.partial(cache_attention, q, k_cache, v_cache, slots, used, bound, tree_bias=bias, tree_cu=cu)


def host_step(torch, device, reps: int) -> dict:
    x = torch.randn(256, device=device)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        (x * 2).sum().item()
        t.append((time.perf_counter() - t0) * 1e6)
    return {"reps": reps, "us_median": statistics.median(t), "us_p10": sorted(t)[len(t) // 10]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="9b")
    ap.add_argument("--gpu", default=None, help="catalogue GPU whose datasheet peak the fractions use "
                    "(default: the CUDA device's, else h200)")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128,256,512,1024,4096")
    ap.add_argument("--rotate", type=int, default=4, help="weight sets timed together (L2 never holds one)")
    ap.add_argument("--decode-batch", default="1,2,4,8,16,32,64", help="batches of the GDN decode rows")
    ap.add_argument("--decode-launches", default=DECODE_LAUNCHES,
                    help="launches of the GDN decode rows, value split x warps")
    ap.add_argument("--decode-variants", default="", help="experiments/kernel_variants.py decode variants, "
                    "each timed at every launch beside the shipped kernel")
    ap.add_argument("--attention-variants", default="", help="experiments/kernel_variants.py attention "
                    "variants, each timed at the default launch beside the shipped kernel")
    ap.add_argument("--attention-launches", default="", help="cache_attention launches, keys a tile x warps x "
                    "stages x target programs x fewest keys a split x rows a tile, comma-separated (default: the "
                    "kernel's own)")
    ap.add_argument("--sglang", action="store_true", help="time SGLang's own GDN decode beside ours (its kernels "
                    "from BOLE_SGLANG_WHEEL or an install)")
    ap.add_argument("--parts", default=None, help="only these parts, comma-separated (default: all)")
    ap.add_argument("--chain", type=int, default=200, help="kernels in the floor's graph")
    ap.add_argument("--attention-batch", default="1,4,16", help="batches of the attention rows")
    ap.add_argument("--attention-kv", default="1024,4096,16384", help="cache lengths of the attention rows")
    ap.add_argument("--attention-tokens", default="1,2,4,8,32,64", help="tokens a request of the attention "
                    "rows (1: a decode; 2-4: the drafter's levels; more: a verify's tree)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a tiny model and few rows (CPU test)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli.catalog.hardware import detect_gpu, resolve_gpu
    from kernel_variants import ATTENTION, DECODE, VARIANTS

    from bole_cli.catalog.models import resolve_model, tiny_spec

    spec = tiny_spec() if args.smoke else resolve_model(args.model)
    launches = [tuple(int(n) for n in launch.split("x")) for launch in args.decode_launches.split(",")]
    attention_launches = [tuple(int(n) for n in launch.split("x")) for launch in
                          filter(None, args.attention_launches.split(","))] or [None]
    variants = [v for v in args.decode_variants.split(",") if v]
    attention_variants = [v for v in args.attention_variants.split(",") if v]
    for option, names, site in (("--decode-variants", variants, DECODE),
                                ("--attention-variants", attention_variants, ATTENTION)):
        wrong = [v for v in names if v not in VARIANTS or VARIANTS[v].site != site]
        if wrong:
            ap.error(f"{option}: not {site.attr} variants of experiments/kernel_variants.py: {', '.join(wrong)}")
    if any(len(launch) != 6 for launch in attention_launches if launch):
        ap.error("--attention-launches: each is keys a tile x warps x stages x target programs x fewest keys a "
                 "split x rows a tile, e.g. 64x4x3x264x256x16")
    chosen = None if args.parts is None else set(args.parts.split(","))
    if chosen is not None and chosen - set(PARTS):  # before any timing starts
        ap.error(f"--parts: {', '.join(sorted(chosen - set(PARTS)))} not among {', '.join(PARTS)}")
    sglang = None
    if args.sglang:
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels

        sglang = load_sglang_kernels(with_norm=True)
    rows = [1, 4] if args.smoke else [int(r) for r in args.rows.split(",")]
    cuda = args.device == "cuda"
    detected = detect_gpu() if args.gpu is None and cuda else None
    if detected is not None and detected.spec is None:
        print(f"warning: {detected.name} is not in the GPU catalogue: its fractions use the H200's datasheet "
              "(--gpu names another)", file=sys.stderr)
    gpu = detected.spec if detected is not None and detected.spec is not None else resolve_gpu(args.gpu or "h200")
    if cuda:
        from bole_cli.timing import measure_copy_bandwidth, warm_gpu

        warm_gpu(torch)
        copy_bw = measure_copy_bandwidth(torch)
    else:
        copy_bw = None
    peak = gpu.bf16_flops if cuda else None
    dtype = torch.bfloat16 if cuda else torch.float32
    doc = {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "command": "python " + " ".join(sys.argv),
        "model": spec.name, "datasheet_gpu": gpu.name, "copy_bandwidth_bytes_s": copy_bw,
        "peak_bf16_flops": peak,
    }
    if cuda:
        import triton

        doc["versions"]["triton"] = triton.__version__

    def save():  # after each part: a call cut by its time limit keeps what it measured
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    rotate = 2 if args.smoke else args.rotate
    parts = {
        "gemms": lambda: gemm_rows(torch, spec, rows, args.device, dtype, rotate, peak or 0.0, copy_bw or 0.0),
        "kernel_floor": lambda: kernel_floor(torch, args.device, 8 if args.smoke else args.chain),
        "host_step": lambda: host_step(torch, args.device, 20 if args.smoke else 500),
        "small_kernels": lambda: small_kernels(torch, spec, args.device, dtype, [1] if args.smoke else [1, 16, 64, 256],
                                               4 if args.smoke else 50),
        "gdn_decode": lambda: gdn_decode_rows(torch, spec, [1, 2] if args.smoke else
                                              [int(b) for b in args.decode_batch.split(",")], args.device, dtype,
                                              rotate, 0.0 if args.smoke else 256e6, launches, sglang, variants),
        "attention": lambda: attention_rows(
            torch, spec, *(([1, 2], [16], [1, 4]) if args.smoke else
                           ([int(x) for x in a.split(",")] for a in
                            (args.attention_batch, args.attention_kv, args.attention_tokens))),
            args.device, dtype, rotate, 0.0 if args.smoke else 256e6, attention_launches, attention_variants),
    }
    assert tuple(parts) == PARTS
    for name, part in parts.items():
        if chosen is None or name in chosen:
            doc[name] = part()
            save()
    if "kernel_floor" in doc and "host_step" in doc:
        print(f"kernel floor {doc['kernel_floor']['us_per_kernel']:.2f} us, host step "
              f"{doc['host_step']['us_median']:.1f} us")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
