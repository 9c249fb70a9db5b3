"""The whole speculative step against the sum of its kernels, and the drafter level against
its weight-read floor (issue 31's "whole step within 1.10x of its kernels" and "drafter per
level within 1.2x of its floor, full vocabulary and 32k head"; experiments/README.md).

The step is `bole bench e2e`'s (bole_cli/bench/e2e/decoders.py): draft levels, the budget's
tree, verify, the device walk (sampling and path compaction), the commit, each a CUDA graph
after its first run, and the step's one host sync handing back the committed tokens. Per
decoder it reports, per step (medians over --steps):

- wall: host clock around one whole step, its sync included (what a serving loop pays);
- span: CUDA events from before the draft to after the commit (the device's timeline);
- kernels: the sum of the GPU kernels' own time over one step, from torch.profiler over
  --profile-steps graph-replayed steps (their count too); wall / kernels is the target's ratio.

The drafter level: one level (1 row a request, and the second level's top-k rows) replayed
as a CUDA graph (median of the replays), for the full vocabulary and each --draft-vocab head,
with its top-k through kernels.draft_topk and, beside it, through torch.topk (the top-k also
timed alone, --topk-rows);
the floor is the bytes the level must read (MTPDrafter.level_read_bytes) at the copy rate
measured in the same process (timing.measure_copy_bandwidth).

The sample phase alone (--walk-shapes): the target's argmax over a tree's logits and the
accepted path's walk (bench/e2e/device_walk.py), once through kernels.tree_accept (what the
step runs on CUDA) and once through the torch walk (its reference, what the step ran before),
as graph replays, checked to agree (experiments/NOTES.md "The sample phase in one launch").

    python experiments/whole_step_bench.py --model 9b --out experiments/results/runtime/F.json
    python experiments/whole_step_bench.py --smoke --out /tmp/w.json   # CPU, tiny model: no timings to quote
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runtime_step_bench import kernel_profile  # noqa: E402 (experiments/, the script's folder)


def per_call(prof: dict, calls: int) -> list[dict]:
    """A kernel_profile's kernels by time, per call: what a level or a step spends where."""
    rows = sorted(prof["by_name"].items(), key=lambda kv: -kv[1][1])
    return [{"kernel": k, "count": c / calls, "ms": ms / calls} for k, (c, ms) in rows]


def whole_steps(torch, bench, name: str, batch: int, args, cuda: bool) -> dict:
    """One decoder's steps: wall, span and phases per step, then the kernels of
    --profile-steps more."""
    from bole_cli.bench.e2e.decoders import PHASES

    warm = max(args.warmup, 2)
    dec = bench.decoder(name, batch, warm + args.steps + 2 * args.profile_steps + 2)
    for _ in range(warm):
        dec.step()
    if cuda:
        torch.cuda.synchronize()
    walls, spans, phases, hosts = [], [], {p: [] for p in PHASES}, []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        marks, host = dec.step()  # ends in the step's one sync (the committed tokens)
        walls.append(time.perf_counter() - t0)
        hosts.append(host)
        spans.append(dec.clock.seconds(marks[0], marks[-1]))
        for i, p in enumerate(PHASES):
            phases[p].append(dec.clock.seconds(marks[i], marks[i + 1]))
    row = {"decoder": name, "batch": batch, "steps": args.steps,
           "wall_ms": 1e3 * statistics.median(walls), "span_ms": 1e3 * statistics.median(spans),
           "host_ms": 1e3 * statistics.median(hosts),
           "phase_ms": {p: 1e3 * statistics.median(v) for p, v in phases.items()},
           "graphs": dec.graphs.enabled,
           "mean_accepted": sum(map(sum, dec.accepted[warm:])) / (args.steps * batch)}
    if hasattr(dec, "plan"):
        row["tree_tokens"] = int(sum(dec.plan.sizes))
    if cuda:
        def run(eager=False):
            for _ in range(args.profile_steps):
                dec.step(eager=eager)

        prof = kernel_profile(torch, run)
        row["profiled"] = "graph replays"
        if prof["kernels"] == 0:  # a CUPTI that does not see into graphs: the same kernels, eagerly
            prof = kernel_profile(torch, lambda: run(eager=True))
            row["profiled"] = "eager steps"
        row["by_kernel"] = per_call(prof, args.profile_steps)[:30]
        row["kernel_ms"] = prof["kernel_ms"] / args.profile_steps
        row["kernels"] = prof["kernels"] / args.profile_steps
        row["wall_over_kernels"] = row["wall_ms"] / row["kernel_ms"]
        row["span_over_kernels"] = row["span_ms"] / row["kernel_ms"]
    dec.graphs.clear()
    return row


def draft_levels(torch, bench, batch: int, vocabs: list, rate: float, args, cuda: bool) -> list[dict]:
    """One drafter level replayed as a graph, against its weight-read floor."""
    from bole_cli.bench.drafter import MTPDrafter
    from bole_cli.timing import capture_graph, replay_ms

    rows_out = []
    for vocab in vocabs:
        drafter = MTPDrafter(bench.model, bench.layout, seed=bench.seed + 4321, draft_vocab=vocab)
        st = drafter.new_state(batch, bench.context)
        for lvl, rows in ((0, 1), (1, bench.layout.topk)):
            gen = torch.Generator(device=bench.device).manual_seed(batch * 31 + rows)
            tokens = torch.randint(drafter.draft_vocab, (batch, rows), generator=gen, device=bench.device)
            hidden = torch.randn(batch, rows, bench.spec.hidden, generator=gen, device=bench.device,
                                 dtype=drafter.dtype)

            def level():
                drafter.level(st, lvl, tokens, hidden, 1 if lvl else 0)

            row = {"batch": batch, "draft_vocab": drafter.draft_vocab, "rows": rows,
                   "read_bytes": drafter.level_read_bytes(batch, bench.context, rows)}
            if cuda:
                if drafter.topk_kernel:  # the baseline: the level with torch.topk, same weights and inputs
                    drafter.topk_kernel = False
                    row["ms_torch_topk"] = replay_ms(capture_graph(torch, [level]), rep_ms=100, warmup_ms=25)
                    drafter.topk_kernel = True
                graph = capture_graph(torch, [level])
                row["ms"] = replay_ms(graph, rep_ms=100, warmup_ms=25)

                def replays():
                    for _ in range(5):
                        graph.replay()

                prof = kernel_profile(torch, replays)
                row["kernel_ms"], row["kernels"] = prof["kernel_ms"] / 5, prof["kernels"] / 5
                row["by_kernel"] = per_call(prof, 5)  # where the level's time over its floor goes
                row["floor_ms"] = 1e3 * row["read_bytes"] / rate
                row["over_floor"] = row["ms"] / row["floor_ms"]
            else:
                level()
            rows_out.append(row)
    return rows_out


def topk_alone(torch, vocabs: list, rows: list, k: int) -> list[dict]:
    """The drafter's top-k alone on bf16 logits: kernels.draft_topk (the hot-token map in
    its merge) against torch.topk and the map's index, as graph replays, checked to agree."""
    from bole_cli.kernels.draft_topk import draft_topk
    from bole_cli.kernels.reference import draft_topk_ref
    from bole_cli.timing import capture_graph, replay_ms

    out = []
    for vocab in vocabs:
        for n in rows:
            gen = torch.Generator(device="cuda").manual_seed(n * 7 + vocab)
            x = torch.randn(n, vocab, generator=gen, device="cuda").to(torch.bfloat16)
            hot = torch.randperm(vocab, generator=gen, device="cuda")
            ours = draft_topk(x, k, token_map=hot)
            theirs = hot[torch.topk(x, k, dim=-1).indices]
            row = {"vocab": vocab, "rows": n, "k": k,
                   "agrees": bool(torch.equal(ours, draft_topk_ref(x, k, hot))
                                  and torch.equal(x.gather(1, draft_topk(x, k)), torch.topk(x, k).values)),
                   "same_ids_as_torch": bool(torch.equal(ours, theirs))}
            row["ms"] = replay_ms(capture_graph(torch, [lambda: draft_topk(x, k, token_map=hot)]), 100, 25)
            row["ms_torch_topk"] = replay_ms(capture_graph(torch, [lambda: hot[torch.topk(x, k, dim=-1).indices]]),
                                             100, 25)
            out.append(row)
            print(f"top-k alone vocab {vocab:6d} rows {n:3d}: ours {1e3 * row['ms']:6.1f} us, torch.topk "
                  f"{1e3 * row['ms_torch_topk']:6.1f} us, agrees {row['agrees']}", flush=True)
    return out


def walk_alone(torch, spec, shapes: list, batches: list, tree_tokens: int, acceptance: str,
               cuda: bool) -> list[dict]:
    """The sample phase alone, argmax + walk, kernel against torch ops (graph replays; on a
    CPU the agreement only)."""
    from bole_cli.bench.drafter import build_layout
    from bole_cli.bench.e2e.device_walk import DeviceWalk, simulated_ranks
    from bole_cli.bench.e2e.simulated_acceptance import load_e2e_acceptance
    from bole_cli.bench.e2e.tree_budget import plan_trees
    from bole_cli.timing import capture_graph, replay_ms

    out, acc, dev = [], load_e2e_acceptance(acceptance), torch.device("cuda" if cuda else "cpu")
    for depth, topk in shapes:
        q = acc.rows(depth, topk)
        lay = build_layout(depth, topk, q)
        for batch in batches:
            plan = plan_trees(lay, batch, tree_tokens * batch, q=q)
            n = plan.forest.n_nodes
            gen = torch.Generator(device=dev).manual_seed(depth * 100 + batch)
            logits = torch.randn(n, spec.vocab, generator=gen, device=dev).to(torch.bfloat16)
            tokens = logits.argmax(-1)
            tokens[torch.rand(n, generator=gen, device=dev) < 0.3] += 1  # some drafts rejected
            row = {"shape": f"{depth}x{topk}", "batch": batch, "nodes": n}
            for kind, greedy in (("greedy", True), ("ranked", False)):
                ranks = None if greedy else simulated_ranks(q, topk, depth, 0, batch, 4)
                walk = DeviceWalk(plan, dev, greedy=greedy, ranks=ranks)
                target = logits.argmax(-1)
                mine = walk.sample(target, tokens, kernel=True)
                ref = walk.sample(target, tokens, kernel=False)
                row[f"{kind}_agrees"] = all(torch.equal(a, b) for a, b in zip(mine, ref))
                if not cuda:
                    continue
                for how, kernel in (("kernel", True), ("torch", False)):
                    graph = capture_graph(torch, [lambda: walk.sample(logits.argmax(-1), tokens, kernel=kernel)])
                    row[f"{kind}_{how}_ms"] = replay_ms(graph, 100, 25)
            out.append(row)
            if not cuda:
                continue
            print(f"sample alone {row['shape']} b{batch:<3d} N {n:4d}: kernel {1e3 * row['greedy_kernel_ms']:6.1f} "
                  f"us, torch walk {1e3 * row['greedy_torch_ms']:6.1f} us (greedy); ranked "
                  f"{1e3 * row['ranked_kernel_ms']:6.1f} / {1e3 * row['ranked_torch_ms']:6.1f} us; agrees "
                  f"{row['greedy_agrees'] and row['ranked_agrees']}", flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="9b")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--tree-tokens", type=int, default=32, help="tree tokens a request (the budget / batch)")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--chain-depth", type=int, default=4)
    ap.add_argument("--decoders", default="ar,bole,bole-chain")
    ap.add_argument("--draft-vocab", default="32768", help="heads timed beside the full vocabulary")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--acceptance", default="paper-mbpp")
    ap.add_argument("--topk-rows", default="1,4,16,64,256", help="rows of the top-k timed alone ('' skips)")
    ap.add_argument("--walk-shapes", default="3x2,6x4,8x4", help="trees whose sample phase is timed alone ('' skips)")
    ap.add_argument("--walk-batch", default="1,4,16")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU (a test: no timings)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli.bench.e2e.harness import E2EBench
    from bole_cli.catalog.models import resolve_model, tiny_spec
    from bole_cli.timing import measure_copy_bandwidth

    cuda = not args.smoke
    if args.smoke:
        spec, dtype, device = tiny_spec(layers=4), torch.float32, "cpu"
        args.context, args.depth, args.topk, args.tree_tokens = 16, 3, 2, 4
        args.chain_depth, args.steps, args.warmup, args.profile_steps = 2, 2, 1, 1
    else:
        spec, dtype, device = resolve_model(args.model), torch.bfloat16, "cuda"
    vocabs = [None] + [int(v) for v in args.draft_vocab.split(",") if v]
    if args.smoke:
        vocabs = [None, 64]
    doc = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "versions": {"torch": torch.__version__, "python": platform.python_version()},
           "command": "python " + " ".join(sys.argv), "model": spec.name, "context": args.context,
           "shape": [args.depth, args.topk], "tree_tokens_per_request": args.tree_tokens,
           "chain_depth": args.chain_depth, "acceptance": args.acceptance,
           "copy_rate_Bps": None, "steps": [], "draft_levels": []}
    if cuda:
        import triton

        doc["versions"]["triton"] = triton.__version__
        doc["copy_rate_Bps"] = measure_copy_bandwidth(torch)

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    from bole_cli.limits import DRAFT_TOPK_MAX_K

    if cuda and args.topk_rows and args.topk <= DRAFT_TOPK_MAX_K:  # a wider beam: torch.topk only
        doc["topk_alone"] = topk_alone(torch, [spec.vocab] + vocabs[1:], [int(r) for r in args.topk_rows.split(",")],
                                       args.topk)
        save()
    if args.walk_shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.walk_shapes.split(",")]
        walk_batches = [int(b) for b in args.walk_batch.split(",")]
        if args.smoke:
            shapes, walk_batches = [(3, 2)], [1, 2]
        doc["sample_alone"] = walk_alone(torch, spec, shapes, walk_batches, args.tree_tokens, args.acceptance, cuda)
        save()
    batches = [int(b) for b in args.batch.split(",")] if not args.smoke else [1, 2]
    bench = E2EBench(spec, device=device, dtype=dtype, context=args.context, depth=args.depth,
                     topk=args.topk, acceptance=args.acceptance, budget=args.tree_tokens * batches[0],
                     warmup=args.warmup, steps=args.steps)
    bench.chain_depth = args.chain_depth
    for batch in batches:
        bench.budget_policy = args.tree_tokens * batch  # the trees' tokens over the batch
        with torch.inference_mode():
            for name in args.decoders.split(","):
                row = whole_steps(torch, bench, name, batch, args, cuda)
                doc["steps"].append(row)
                save()
                if cuda:
                    print(f"{spec.name} b{batch:<3d} {name:10s} wall {row['wall_ms']:7.3f}  span "
                          f"{row['span_ms']:7.3f}  kernels {row['kernel_ms']:7.3f} ms ({row['kernels']:.0f})  "
                          f"wall/kernels {row['wall_over_kernels']:.3f}  phases "
                          + " ".join(f"{p} {v:.3f}" for p, v in row["phase_ms"].items()), flush=True)
            doc["draft_levels"] += draft_levels(torch, bench, batch, vocabs, doc["copy_rate_Bps"] or 1.0,
                                                args, cuda)
        save()
        if cuda:
            torch.cuda.empty_cache()
    if cuda:
        print(f"copy rate {doc['copy_rate_Bps'] / 1e12:.2f} TB/s")
        for r in doc["draft_levels"]:
            base = f", torch.topk {r['ms_torch_topk']:.3f}" if "ms_torch_topk" in r else ""
            print(f"drafter b{r['batch']:<3d} vocab {r['draft_vocab']:6d} rows {r['rows']}: {r['ms']:.3f} ms, "
                  f"floor {r['floor_ms']:.3f} ({r['over_floor']:.2f}x){base}")
    save()


if __name__ == "__main__":
    main()
