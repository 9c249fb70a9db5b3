"""The full-attention layers' KV read, timed three ways (issue 16's batch-1 gap, I16-d).

`bole calibrate` times a step whose requests all hold exactly the committed length, so its
attention is a mask-free flash call (split over the KV for small batches); `bole bench e2e`
keeps one CUDA graph for all steps, so it reads a fixed KV bucket with an additive mask,
which SDPA runs on its memory-efficient kernel. This script times, per (batch, rows):
  exact   what calibrate runs: flash over exactly the committed keys (+ the tree part);
  masked  what e2e runs: SDPA with the additive mask over the bucket;
  varlen  flash varlen over the bucket with per-request used lengths (`seqused_k`), GQA
          folded into the query rows (one graph for any lengths), + the tree part: the
          runtime's read since I16-d (runtime/attention.py; I16-d ran the same
          computation written out in this script);
  varlen_gqa  the same with flash's own GQA (the group as heads, not rows);
and checks that masked and varlen agree with exact.

    python experiments/attention_paths.py --model 9b --out experiments/results/issue16/attention-9b.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bole_cli.catalog.models import resolve_model
from bole_cli.runtime.attention import split_tree_attention, varlen_cache_attention
from bole_cli.timing import time_graph, warm_gpu


def case(spec, bsz, t, committed, bucket, dev, dt):
    g = spec.attn_group
    hkv, d = spec.attn_kv_heads, spec.attn_head_dim
    gen = torch.Generator(device=dev).manual_seed(bsz * 1000 + t)
    lmax = bucket + 8
    kc = torch.randn(bsz, hkv, lmax, d, generator=gen, device=dev, dtype=dt)
    vc = torch.randn(bsz, hkv, lmax, d, generator=gen, device=dev, dtype=dt)
    rows = t * g
    qf = torch.randn(bsz, hkv, rows, d, generator=gen, device=dev, dtype=dt)
    # tree part: the tree's keys sit at committed..committed+t in the cache (the runtime writes them there)
    anc = torch.rand(bsz, t, t, generator=gen, device=dev) < 0.3
    anc |= torch.eye(t, dtype=torch.bool, device=dev)
    anc = torch.tril(anc)
    anc_rows = anc[:, None, :, None, :].expand(bsz, 1, t, g, t).reshape(bsz, 1, rows, t)
    tree_bias = torch.zeros(anc_rows.shape, device=dev).masked_fill_(~anc_rows, float("-inf"))
    k_tree, v_tree = kc[:, :, committed:committed + t], vc[:, :, committed:committed + t]
    vis = torch.zeros(bsz, 1, rows, bucket, dtype=torch.bool, device=dev)
    vis[..., :committed] = True
    vis[..., committed:committed + t] = anc_rows
    bias = torch.zeros(vis.shape, dtype=dt, device=dev).masked_fill_(~vis, float("-inf"))
    slots = torch.arange(bsz, device=dev)
    lens = torch.full((bsz,), committed, dtype=torch.int32, device=dev)

    def exact():
        return split_tree_attention(qf, kc[:, :, :committed], vc[:, :, :committed], k_tree, v_tree, tree_bias)

    def masked():
        return F.scaled_dot_product_attention(qf, kc[:, :, :bucket], vc[:, :, :bucket], attn_mask=bias)

    def varlen(group=1):  # the runtime's bucketed read (runtime/attention.py)
        part = varlen_cache_attention(qf, kc, vc, slots, lens, group=group)
        return split_tree_attention(qf, None, None, k_tree, v_tree, tree_bias, cache_part=part)

    ref = exact().float()
    row = {"batch": bsz, "tree_tokens": t, "rows": rows, "committed": committed, "bucket": bucket}
    for name, fn in (("exact", exact), ("masked", masked), ("varlen", varlen),
                     ("varlen_gqa", lambda: varlen(g))):
        try:
            got = fn().float()
            row[f"{name}_rel_err"] = ((got - ref).norm() / ref.norm()).item()
            row[f"{name}_us"] = time_graph(torch, [fn])
        except Exception as exc:  # noqa: BLE001 - a path that does not run is a finding
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="9b")
    ap.add_argument("--batch", default="1,4,16,64")
    ap.add_argument("--tree-tokens", default="1,8,32,64")
    ap.add_argument("--committed", type=int, default=4096)
    ap.add_argument("--bucket", type=int, default=4331)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    spec = resolve_model(a.model)
    dev, dt = "cuda", torch.bfloat16
    warm_gpu(torch)
    rows = []
    for b in map(int, a.batch.split(",")):
        for t in map(int, a.tree_tokens.split(",")):
            if b * t > 1024:
                continue
            rows.append(case(spec, b, t, a.committed, a.bucket, dev, dt))
            r = rows[-1]
            print(f"B{b:<3} T{t:<3} " + "  ".join(
                f"{k} {r.get(k + '_us', float('nan')):7.1f}us err {r.get(k + '_rel_err', float('nan')):.1e}"
                for k in ("exact", "masked", "varlen", "varlen_gqa")) + ("  " + r.get("varlen_error", "")), flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": spec.name,
           "command": "python experiments/attention_paths.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v and k != "out"),
           "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
