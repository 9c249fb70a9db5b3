"""The runtime's decode and verify steps by variant, for the production-grade step
(docs/design.md §8 "The decode step"; experiments/README.md, rows R-*):

- before:   the GDN decode as one-node trees (conv, gates, verify, replay commit, norm:
            five launches a layer plus PyTorch glue), every elementwise piece eager;
- fused:    kernels.gdn_decode (one launch a GDN layer), the rest eager;
- compiled: fused, and runtime.fusion's pieces compiled by torch.compile;
- attn-pieces: compiled, the attention to the cache through kernels.cache_attention (split
            along the keys), its input (q/k norms, RoPE) compiled and the KV written by index
            writes (R-7's production step);
- cublas:   attn-pieces with that input in one launch (kernels.attention_in), every
            projection through cuBLAS (R-11 to R-14's "production");
- production: the runtime's default on CUDA: cublas, and in_proj and the LM head of one-row
            steps through kernels.skinny_mm with the add + RMSNorm before them fused, and
            out_proj, o_proj and down too (runtime.model.SKINNY_DEFAULT,
            limits.SKINNY_DEFAULT_MAX_ROWS; the last three since S10-b);
- production-s9: production as shipped from R-14 to S9, in_proj and the LM head alone;
- skinny:   cublas, and steps of at most 64 rows project through kernels.skinny_mm
            instead of cuBLAS, the residual adds, RMSNorms and SwiGLU fused in
            (HybridModel(skinny_mm=True); experiments/skinny_mm_bench.py times the GEMMs alone);
- skinny-normed: cublas, and in_proj and the LM head of steps of at most 64 rows through
            kernels.skinny_mm with the add + RMSNorm fused (R-14);
- skinny-io: skinny-normed, and out_proj and o_proj (the attention gate fused) too.
- skinny-down1: production-s9, and out_proj, o_proj and the MLP's down projection of one-row
            steps too (the rule's 32 weight rows a program: R-12's grid put those shapes at
            16.7 / 16.7 / 33.3 us against cuBLAS's 17.5 / 17.5 / 35.0 at 9B); the
            production default since S10-b, named as S10-b's record names it.
- decode-SxW: production with every fused GDN decode launched S programs a head of W warps
            (limits.GDN_DECODE_LAUNCH replaced for the variant; component_bench times the
            kernel alone).
- attention-s8: production with the attention over the cache as shipped before S9-b
            (kernel_variants' a-before-s9: the merge a chunk at a time, three stages always).

Each step is timed two ways, as `bole calibrate` does (runtime.timer): back-to-back CUDA
graph replays, and the serving step (host metadata, replay, eager commit, between syncs);
median of --repeats. One eager step per variant runs under torch.profiler for the sum of
its kernels' time and their count. Correctness: the variants' logits and committed GDN
states after one step agree (bf16), and the fused kernel matches its float64 reference.

    python experiments/runtime_step_bench.py --out experiments/results/runtime/steps-h200.json
    python experiments/runtime_step_bench.py --smoke --out /tmp/s.json     # CPU smoke, no timings to quote
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

from bole_cli import limits

# name: (GDN decode, compiled pieces, cache_attention kernel, the skinny GEMM's projections
# (HybridModel.set_skinny: None for the runtime's default), attention_in kernel[, the skinny
# GEMM's most rows: set_skinny's default when absent])
VARIANTS = {"before": ("tree", False, False, False, False), "fused": ("fused", False, False, False, False),
            "compiled": ("fused", True, False, False, False), "attn-pieces": ("fused", True, True, False, False),
            "cublas": ("fused", True, True, False, True), "production": ("fused", True, True, None, True),
            "skinny": ("fused", True, True, True, True),
            "skinny-normed": ("fused", True, True, "in_proj,lm_head", True),
            "skinny-io": ("fused", True, True, "in_proj,lm_head,out_proj,o_proj", True),
            "skinny-down1": ("fused", True, True, "in_proj,lm_head,out_proj,o_proj,down", True, 1),
            "production-s9": ("fused", True, True, "in_proj,lm_head", True, 1),
            **{f"decode-{launch}": ("fused", True, True, None, True) for launch in ("1x8", "4x2", "8x2", "16x1")}}
SHIPPED_LAUNCH = limits.GDN_DECODE_LAUNCH  # as shipped: what "production" and the others run
# variants that run production with a kernel variant of experiments/kernel_variants.py in place
KERNEL_VARIANTS = {"attention-s8": "a-before-s9"}
VARIANTS.update({name: VARIANTS["production"] for name in KERNEL_VARIANTS})


def launch_table(name: str) -> tuple:
    """limits.GDN_DECODE_LAUNCH as variant `name` runs it: decode-SxW every step at S x W."""
    if name.startswith("decode-"):
        split, warps = (int(n) for n in name[len("decode-"):].split("x"))
        return ((None, split, warps),)
    return SHIPPED_LAUNCH


def set_variant(timer, name: str) -> None:
    from bole_cli.runtime.fusion import Fusion

    decode, compiled, cache_kernel, skinny, attention_in, *rows = VARIANTS[name]
    limits.GDN_DECODE_LAUNCH = launch_table(name)  # main() puts the shipped table back at its end
    set_kernels(KERNEL_VARIANTS.get(name))
    timer.model.gdn_decode = decode
    timer.model.fuse = Fusion(compiled)
    timer.model.cache_kernel = cache_kernel
    timer.model.set_skinny(skinny, *rows)
    timer.model.attention_in_kernel = attention_in
    timer.reset_graphs()  # graphs of the previous variant, and a fresh pool for the next


_PLACED = contextlib.ExitStack()  # the kernel variant in place (kernel_variants.kernel_in_place)


def set_kernels(variant) -> None:
    """The shipped kernels back, then kernel_variants' `variant` (None: none) in its site's
    place (main() puts the shipped ones back at its end)."""
    _PLACED.close()
    if variant:
        from kernel_variants import VARIANTS as EDITS
        from kernel_variants import kernel_in_place, load_variant

        _PLACED.enter_context(kernel_in_place(EDITS[variant].site, load_variant(variant)))


def median_ms(fn, repeats: int) -> float:
    return 1e3 * statistics.median(fn() for _ in range(repeats))


def kernel_profile(torch, run) -> dict:
    """The GPU kernels of one call of `run` (torch.profiler, CUDA activity; graph replays
    included: CUPTI reports a graph's kernels one by one): their time and count, the time
    under their ops, and [count, ms] by kernel name (cut to 90 characters)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    total, count, names = 0.0, 0, {}
    for ev in prof.events():
        if "CUDA" in str(getattr(ev, "device_type", "")):  # the kernels themselves (Kineto)
            total += ev.device_time
            count += 1
            entry = names.setdefault(ev.name[:90], [0, 0.0])
            entry[0] += 1
            entry[1] += ev.device_time / 1e3
    by_op = sum(e.self_device_time_total for e in prof.key_averages())  # kernels under their ops
    return {"kernel_ms": total / 1e3, "kernels": count, "kernel_ms_by_op": by_op / 1e3, "by_name": names}


def kernel_sum(torch, step) -> dict:
    """Kernel time and count of one eager step after a first one, and its 20 costliest kernels."""
    step()
    prof = kernel_profile(torch, step)
    top = sorted(prof.pop("by_name").items(), key=lambda kv: -kv[1][1])[:20]
    return {**prof, "top": [{"kernel": k, "count": c, "ms": ms} for k, (c, ms) in top]}


def verify_kernels(torch, timer, kv: int, tokens: int) -> dict:
    """kernel_sum of one serving verify step at batch 1 (the step time_verify's serving graph
    replays: refill_tree, forward_verify, commit_device), after time_verify prepared it."""
    from bole_cli.runtime.tree_metadata import refill_tree

    timer.time_verify(1, kv, tokens)  # (re)prepares the step and loads its inputs
    key = ("prepared", "verify", timer.path, 1, kv, tokens)
    tb, accepted = timer._steps[key]
    inputs = timer._steps[key + ("inputs",)]  # loaded by the serving step's last prepare
    cache = timer._cache_for(1, kv + tokens, kv, tokens)
    m = timer.model

    def step():
        refill_tree(tb, inputs.parents, inputs.tokens, inputs.base, m.rope)
        m.commit_device(cache, m.forward_verify(cache, tb, path=timer.path), accepted)

    with torch.inference_mode():
        return kernel_sum(torch, step)


def decode_agreement(torch, timer, batch: int, kv: int) -> dict:
    """Logits and states after one decode step, per variant, against `before`."""
    cache = timer._cache_for(batch, kv + 1, kv)
    base = cache.clone()
    out = {}
    tokens = torch.randint(timer.spec.vocab, (batch,))
    for name in VARIANTS:
        set_variant(timer, name)
        c = base.clone()
        with torch.inference_mode():
            db = timer.model.prepare_decode(c, tokens, list(range(batch)))
            logits = timer.model.forward_decode(c, db).float()
        out[name] = (logits, c.gdn_state.float(), c.conv_state.float())
    ref = out[next(iter(out))]  # the first variant
    rel = (lambda a, b: float((a - b).norm() / b.norm()))
    return {name: {"logits_rel": rel(v[0], ref[0]), "state_rel": rel(v[1], ref[1]),
                   "conv_rel": rel(v[2], ref[2])} for name, v in list(out.items())[1:]}


def kernel_vs_reference(torch, spec, device) -> dict:
    from bole_cli.kernels.gdn_decode import gdn_decode
    from bole_cli.kernels.reference import gdn_decode_ref

    g = torch.Generator(device=device).manual_seed(0)
    bsz, hk, hv, kd, vd = 4, spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim
    dim = 2 * hk * kd + hv * vd
    bf = torch.bfloat16

    def r(*s, std=1.0, dtype=bf):
        return (torch.randn(*s, generator=g, device=device) * std).to(dtype)

    case = dict(x=r(bsz, dim), conv_state=r(8, dim, spec.conv_kernel - 1), conv_w=r(dim, spec.conv_kernel, std=0.5),
                conv_b=None, a=r(bsz, hv), b=r(bsz, hv), A_log=r(hv, std=0.5, dtype=torch.float32),
                dt_bias=r(hv, std=0.5, dtype=torch.float32), state=r(8, hv, vd, kd, std=0.05, dtype=torch.float32),
                state_indices=torch.tensor([5, 0, 3, 7], device=device), key_heads=hk,
                z=r(bsz, hv * vd), norm_w=r(vd).abs() + 0.5)
    want, want_state, _ = gdn_decode_ref(**case)
    got = gdn_decode(**{k: (v.clone() if k in ("state", "conv_state") else v) for k, v in case.items()})
    st = case["state"].clone()
    gdn_decode(**{**case, "state": st, "conv_state": case["conv_state"].clone()})
    floor = float((want.to(bf).double() - want).norm() / want.norm())
    return {"o_rel": float((got.double() - want).norm() / want.norm()), "o_bf16_floor": floor,
            "state_rel": float((st.double() - want_state).norm() / want_state.norm())}


def main(argv=None) -> None:
    try:
        run(argv)
    finally:  # a decode-SxW or attention variant leaves nothing patched behind it
        limits.GDN_DECODE_LAUNCH = SHIPPED_LAUNCH
        set_kernels(None)


def run(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="4b,9b,27b")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--verify-model", default="9b")
    ap.add_argument("--verify-kv", type=int, default=4096)
    ap.add_argument("--verify-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="which of " + ", ".join(VARIANTS))
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, no compile (a test)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli.catalog.models import resolve_model, tiny_spec
    from bole_cli.runtime.timer import HybridForwardTimer

    cuda = not args.smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if not cuda:
        for name, v in VARIANTS.items():  # no C compiler assumed: the pieces run eagerly
            VARIANTS[name] = (v[0], False) + v[2:]
    batches = [int(b) for b in args.batch.split(",")]
    for name in [v for v in VARIANTS if v not in args.variants.split(",")]:
        del VARIANTS[name]
    doc = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "versions": {"torch": torch.__version__, "python": platform.python_version()},
           "command": "python " + " ".join(sys.argv), "kv": args.kv, "variants": VARIANTS,
           "launch_tables": {name: launch_table(name) for name in VARIANTS},
           "decode": [], "verify": [], "profile": [], "agreement": [], "kernel": None}
    if cuda:
        import triton

        doc["versions"]["triton"] = triton.__version__
    models = ["tiny"] if args.smoke else args.models.split(",")

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    for name in models:
        spec = tiny_spec(layers=4) if args.smoke else resolve_model(name)
        if doc["kernel"] is None and cuda:
            doc["kernel"] = kernel_vs_reference(torch, spec, device)
        t0 = time.perf_counter()
        timer = HybridForwardTimer(spec, device, dtype, inner=3, **({"gdn_backend": "kernels"} if not cuda else {}))
        serving = HybridForwardTimer.__new__(HybridForwardTimer)  # the same model, serving-step timing
        serving.__dict__.update(timer.__dict__)
        serving.serving_step = True
        for variant in VARIANTS:
            for bsz in batches:
                set_variant(timer, variant)
                c0 = time.perf_counter()
                replay = median_ms(lambda: timer.time_decode(bsz, args.kv), args.repeats)
                first = time.perf_counter() - c0
                serving._steps = timer._steps
                serving._cache, serving._pool = timer._cache, timer._pool
                serve = median_ms(lambda: serving.time_decode(bsz, args.kv), args.repeats)
                row = {"model": spec.name, "variant": variant, "batch": bsz, "kv": args.kv,
                       "replay_ms": replay, "serving_ms": serve, "first_call_s": first}
                doc["decode"].append(row)
                print(f"{spec.name:14s} {variant:12s} b{bsz:<3d} decode replay {replay:7.3f} ms  "
                      f"serving {serve:7.3f} ms  (first {first:5.1f} s)", flush=True)
                save()
            if cuda and bsz == batches[-1]:
                # one row and the largest batch: a one-row step launches fewer kernels (its
                # skinny projections fuse the add + RMSNorm), the estimate prices both
                for rows in sorted({1, bsz}):
                    set_variant(timer, variant)
                    cache = timer._cache_for(rows, args.kv + 1, args.kv)
                    with torch.inference_mode():
                        db = timer.model.prepare_decode(cache, torch.randint(spec.vocab, (rows,)), list(range(rows)))
                        prof = kernel_sum(torch, lambda: timer.model.forward_decode(cache, db))
                    doc["profile"].append({"model": spec.name, "variant": variant, "batch": rows, "step": "decode",
                                           **prof})
        if cuda:
            doc["agreement"].append({"model": spec.name, "batch": 4, **decode_agreement(torch, timer, 4, args.kv)})
        if args.smoke or name == args.verify_model:
            vkv, vn = (64, 8) if args.smoke else (args.verify_kv, args.verify_tokens)
            for variant in [v for v in VARIANTS if v not in ("fused", "compiled")]:
                set_variant(timer, variant)
                replay = median_ms(lambda: timer.time_verify(1, vkv, vn), args.repeats)
                serving._steps = timer._steps
                serving._cache, serving._pool = timer._cache, timer._pool
                serve = median_ms(lambda: serving.time_verify(1, vkv, vn), args.repeats)
                set_variant(timer, variant)
                dec = median_ms(lambda: timer.time_decode(1, vkv), args.repeats)
                serving._steps = timer._steps
                serving._cache, serving._pool = timer._cache, timer._pool
                dec_serve = median_ms(lambda: serving.time_decode(1, vkv), args.repeats)
                doc["verify"].append({"model": spec.name, "variant": variant, "batch": 1, "kv": vkv,
                                      "tree_tokens": vn, "replay_ms": replay, "serving_ms": serve,
                                      "decode_replay_ms": dec, "decode_serving_ms": dec_serve})
                print(f"{spec.name:14s} {variant:12s} verify {vn} @kv{vkv}: replay {replay:7.3f} serving "
                      f"{serve:7.3f} | decode replay {dec:7.3f} serving {dec_serve:7.3f} ms", flush=True)
                if cuda:  # the serving step's kernels, eagerly: metadata refill, forward, commit
                    doc["profile"].append({"model": spec.name, "variant": variant, "batch": 1,
                                           "step": "verify", "kv": vkv, "tree_tokens": vn,
                                           **verify_kernels(torch, serving, vkv, vn)})
                save()
        print(f"{spec.name}: {time.perf_counter() - t0:.0f} s", flush=True)
        del timer, serving
        if cuda:
            torch.cuda.empty_cache()
    save()
    for p in doc["profile"]:
        print(f"{p['model']:16s} {p['variant']:9s} kernels {p['kernels']:5d}  {p['kernel_ms']:7.3f} ms")
    print(json.dumps({"kernel": doc["kernel"], "agreement": doc["agreement"]}))


if __name__ == "__main__":
    main()
