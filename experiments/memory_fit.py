"""What `bole calibrate --measure` holds on the GPU, against what the estimate counts.

The estimate refuses a cell whose footprint (bole_cli.footprint, the drafter's beside a
verify) exceeds the catalogue's decimal datasheet memory (80 GB = 74.5 GiB), while CUDA
reports more (an H100 79.18 GiB) and the runtime holds more than the footprint: the CUDA
graphs' private pools (2.69 GiB at 27B, batch 16, kv 16384, N 768, the H100's one
out-of-memory cell), the context and the allocator's slack. The two errors cancel there
by chance (experiments/NOTES.md "The estimate's GPU memory"). This run measures both sides
so they can be fixed together: it runs calibrate's own sweep (calibrate.sweep.run_sweep, in
calibrate's order, with the decision's extras: chains, drafter levels, the sample line) on
the runtime calibrate measures, and after every timed point records

- the process's device memory: CUDA's capacity and free bytes, PyTorch's allocated and
  reserved bytes (current and peak since the previous point), the private pools' bytes
  (torch.cuda.memory_snapshot's segments outside the default pool), and the rest
  (capacity - free - reserved: the context, cuBLAS, Triton);
- the estimate's count (RooflineForward.memory) and the runtime's own (its _require);
- for a point that fails (out of memory), the same, as it failed.

Timings are kept short (one round of two): they are not what this run is for.

    python experiments/memory_fit.py --model 27b --out F.json   # calibrate's batches and kv lengths
    python experiments/memory_fit.py --smoke --out /tmp/m.json   # CPU, tiny model: no device memory
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GIB = 2**30


def pool_bytes(torch) -> dict:
    """Bytes in segments of the default pool and of private pools (CUDA graphs'), reserved and
    allocated; None where this torch's snapshot does not say which pool a segment is in."""
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - an older torch: no pool split
        return {"private_reserved": None, "private_allocated": None}
    if segments and "segment_pool_id" not in segments[0]:
        return {"private_reserved": None, "private_allocated": None}
    private = [s for s in segments if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0)]
    return {"private_reserved": sum(s["total_size"] for s in private),
            "private_allocated": sum(s["allocated_size"] for s in private)}


def device_memory(torch, cuda: bool) -> dict:
    """The process's memory now and its peaks since the last call (which resets them)."""
    if not cuda:
        return {}
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    row = {"capacity": total, "free": free, "allocated": torch.cuda.memory_allocated(),
           "reserved": reserved, "peak_allocated": torch.cuda.max_memory_allocated(),
           "peak_reserved": torch.cuda.max_memory_reserved(),
           "outside_torch": total - free - reserved, **pool_bytes(torch)}
    row["peak_in_use"] = row["outside_torch"] + row["peak_reserved"]
    torch.cuda.reset_peak_memory_stats()
    return row


class Recording:
    """calibrate.sweep.StepTimer around MeasuredForward: each call, then the memory it left
    and the counts the estimate and the runtime make for it."""

    def __init__(self, torch, forward, roof, cuda: bool):
        self.torch, self.forward, self.roof, self.cuda = torch, forward, roof, cuda
        self.rows: list[dict] = []
        self._last: tuple = ()

    def _record(self, call: str, batch: int, kv_len: int, tokens: int, fn) -> float:
        """fn's seconds; its memory beside the counts (a point that raises is recorded with its
        error, the memory held when it failed, and raises on: the sweep lists it)."""
        key = (call, batch, kv_len, tokens)
        try:
            seconds = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, then the sweep's to list
            self._point(key)
            self.rows[-1]["error"] = f"{type(exc).__name__}: {exc}"[:600]
            raise  # bare: no name keeps the failed point's frames (and its tensors) alive
        self._point(key)
        return seconds

    def _point(self, key: tuple) -> None:
        """A new point's row, or a repeat of the last point (warm-up, rounds) merged into its
        row: the memory now, the peaks over every call of the point."""
        if key != self._last:
            self._new_row(key)
            self._last = key
            return
        row, now = self.rows[-1]["memory"], device_memory(self.torch, self.cuda)
        if now:
            for k in ("peak_allocated", "peak_reserved", "peak_in_use"):
                now[k] = max(now[k], row[k])
            self.rows[-1]["memory"] = now

    def _new_row(self, key: tuple) -> None:
        """A point's row: its memory now, the counts for it, and what else the runtime holds
        (the drafters MeasuredForward keeps, one per row count; whether the step is graphed)."""
        from bole_cli.runtime.timer import estimate_memory

        call, batch, kv_len, tokens = key
        timer = self.forward.timer
        verify = tokens if call == "verify" else 0
        self.rows.append({
            "call": call, "batch": batch, "kv_len": kv_len, "tokens": tokens,
            "estimate": self.roof.memory(batch, kv_len, verify),
            "runtime_count": estimate_memory(timer.timed_spec, timer.dtype, batch=batch, kv_len=kv_len,
                                             n_tree_tokens=verify, path=timer.path),
            "drafters_held": len(getattr(self.forward, "_drafters", {})),
            "graphs": getattr(timer, "use_graphs", None), "eager_reason": getattr(timer, "eager_reason", ""),
            "memory": device_memory(self.torch, self.cuda)})

    def time_decode(self, batch, kv_len):
        return self._record("decode", batch, kv_len, batch, lambda: self.forward.time_decode(batch, kv_len))

    def time_verify(self, batch, kv_len, n):
        return self._record("verify", batch, kv_len, n, lambda: self.forward.time_verify(batch, kv_len, n))

    def time_draft_level(self, batch, kv_len, rows):
        return self._record("draft_level", batch, kv_len, batch * rows,
                            lambda: self.forward.time_draft_level(batch, kv_len, rows))

    def time_sample(self, batch, tokens):
        return self._record("sample", batch, 0, tokens, lambda: self.forward.time_sample(batch, tokens))


def summary(rows: list[dict]) -> list[dict]:
    """Per verify and decode point: what the process held at its peak against the estimate's
    count, in GiB (the estimate's total is the drafter's too for a verify)."""
    out = []
    for r in rows:
        mem = r["memory"]
        if r["call"] not in ("decode", "verify") or not mem:
            continue
        est = r["estimate"]["total"]
        out.append({"call": r["call"], "batch": r["batch"], "kv_len": r["kv_len"], "tokens": r["tokens"],
                    "failed": "error" in r,
                    "estimate_gib": est / GIB, "peak_in_use_gib": mem["peak_in_use"] / GIB,
                    "over_estimate_gib": (mem["peak_in_use"] - est) / GIB,
                    "private_pools_gib": (None if mem["private_reserved"] is None
                                          else mem["private_reserved"] / GIB),
                    "outside_torch_gib": mem["outside_torch"] / GIB})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="27b")
    ap.add_argument("--batch", default=None, help="batch sizes (default: calibrate's)")
    ap.add_argument("--kv", default=None, help="KV lengths (default: calibrate's)")
    ap.add_argument("--grid", default=None, help="tree-token budgets (default: calibrate's)")
    ap.add_argument("--acceptance", default="paper-mbpp")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny model on CPU, its own small grid (a test: no device memory)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bole_cli.calibrate.acceptance import load_acceptance
    from bole_cli.calibrate.costmodel import RooflineForward
    from bole_cli.calibrate.measured import MeasuredForward
    from bole_cli.calibrate.pipeline import sweep_extras
    from bole_cli.calibrate.sweep import Timing, run_sweep
    from bole_cli.catalog.hardware import detect_gpu, resolve_gpu
    from bole_cli.catalog.models import resolve_model, tiny_spec
    from bole_cli.calibrate.defaults import DEFAULT_BATCHES, DEFAULT_GRID, DEFAULT_KV_LENS
    from bole_cli.runtime.timer import HybridForwardTimer

    cuda = not args.smoke
    # calibrate's grid by default: the drafters and graphs of earlier cells are held when it
    # reaches the big ones, as in a real run
    batches = [int(b) for b in args.batch.split(",")] if args.batch else list(DEFAULT_BATCHES)
    kvs = [int(k) for k in args.kv.split(",")] if args.kv else list(DEFAULT_KV_LENS)
    grid = [int(n) for n in args.grid.split(",")] if args.grid else list(DEFAULT_GRID)
    if args.smoke:
        spec, dtype, device, batches, kvs, grid = tiny_spec(layers=4), torch.float32, "cpu", [1, 2], [16], [2, 4]
        gpu = resolve_gpu("h100")
    else:
        spec, dtype, device = resolve_model(args.model), torch.bfloat16, "cuda:0"
        detected = detect_gpu()
        gpu = detected.spec if detected is not None and detected.spec is not None else None
        if gpu is None:
            print(f"note: {torch.cuda.get_device_name()} is not in the catalogue; catalogue_memory_bytes "
                  "is the H100's (the counts do not depend on the card)")
            gpu = resolve_gpu("h100")
    doc = {"device": torch.cuda.get_device_name() if cuda else "cpu (smoke)",
           "versions": {"torch": torch.__version__, "python": platform.python_version()},
           "command": "python " + " ".join(sys.argv), "model": spec.name, "catalogue_gpu": gpu.key,
           "catalogue_memory_bytes": gpu.memory_bytes, "batches": batches, "kv_lens": kvs, "grid": grid,
           "acceptance": args.acceptance, "start": {}, "failures": [], "summary": []}
    if cuda:
        import triton

        doc["versions"]["triton"] = triton.__version__
        doc["start"] = device_memory(torch, cuda)  # the context alone, before the weights

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)

    timer = HybridForwardTimer(spec, device, dtype, serving_step=True)
    rec = Recording(torch, MeasuredForward(timer), RooflineForward(spec, gpu), cuda)
    doc["rows"] = rec.rows  # the recorder's own list: every save writes the points so far
    doc["after_weights"] = device_memory(torch, cuda)
    extras = sweep_extras(load_acceptance(args.acceptance))
    timing = Timing(warmup=1, repeats=2, max_rounds=1)
    try:
        result = run_sweep(rec, batches, kvs, grid, timing, extras=extras,
                           on_step=lambda _desc: save())
        doc["failures"], doc["interrupted"] = result.failures, result.interrupted
    finally:
        doc["summary"] = summary(rec.rows)
        save()
    if cuda:
        print(f"{doc['device']}: capacity {doc['start']['capacity'] / GIB:.2f} GiB, outside torch at start "
              f"{doc['start']['outside_torch'] / GIB:.2f} GiB; catalogue {gpu.memory_bytes / GIB:.2f} GiB")
        print(f"{'point':26s} {'estimate':>9s} {'peak use':>9s} {'over':>6s} {'pools':>6s}  (GiB)")
        for s in doc["summary"]:
            pools = "-" if s["private_pools_gib"] is None else f"{s['private_pools_gib']:.2f}"
            print(f"{s['call']:7s} b{s['batch']:<3d} kv{s['kv_len']:<6d} N{s['tokens']:<5d} "
                  f"{s['estimate_gib']:9.2f} {s['peak_in_use_gib']:9.2f} {s['over_estimate_gib']:6.2f} {pools:>6s}"
                  + ("  failed" if s["failed"] else ""))
        for f in doc["failures"]:
            print("failed:", f[:200])


if __name__ == "__main__":
    main()
