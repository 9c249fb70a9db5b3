"""How the cache attention's launch rule (kernels.cache_attention.attention_launch) fares on a
launch sweep: component_bench.py's attention records with --attention-launches, one or more
files (a model each). For each (model, batch, kv, tokens, form) cell it prices the rule's
launch, the rule before S15-b (S9-f's, frozen here) and the fastest launch swept, and prints
the cells where the rule is more than --slack slower than the fastest or S9-f's, then the
geomeans. A cell whose rule's or S9-f's launch was not swept is counted as missing, never
guessed.

    python experiments/attention_rule.py experiments/results/components/h100-27b-attention-rows-tile-s15.json \
        experiments/results/components/h100-9b-attention-rows-tile-s15.json

Index of experiments: experiments/README.md (S16-a, S16-b; the H200's sweep is owed by
experiments/owed_h200.sh attention).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bole_cli.catalog.models import resolve_model  # noqa: E402
from bole_cli.console import atomic_write_text  # noqa: E402
from bole_cli.kernels import cache_attention as ca  # noqa: E402
from component_bench import attention_max_keys  # noqa: E402 (experiments/, the script's folder)


# The S9-f rule (experiments/README.md S9-f), the one before S15-b and S16, frozen here as
# what the rule's later branches are judged against: its launches and thresholds as they were
S9F_FEW_ROWS, S9F_FEW_PROGRAMS, S9F_TARGET_PROGRAMS = 32, 64, 264
S9F_FEW_ROWS_LAUNCH = (64, 4, 3, 128, 128, 16)
S9F_MANY_ROWS_LAUNCH = (64, 4, 2, 132, 128, 16)
S9F_FULL_LAUNCH = (32, 8, 3, 264, 256, 64)


def rule_before(batch: int, kv_heads: int, rows: int) -> tuple[int, ...]:
    """S9-f's launch: 16-row tiles but where 64 rows' tiles alone fill the GPU."""
    tiles = batch * kv_heads * -(-rows // 16)
    if rows <= S9F_FEW_ROWS or tiles < S9F_FEW_PROGRAMS:
        return S9F_FEW_ROWS_LAUNCH
    return S9F_FULL_LAUNCH if tiles >= S9F_TARGET_PROGRAMS and rows >= S9F_FULL_LAUNCH[5] else S9F_MANY_ROWS_LAUNCH


ROW_FIELDS = (("batch", int), ("kv", int), ("tokens", int), ("form", str))


def launch_rows(rows: list[dict]) -> list[dict]:
    """A sweep's rows at an explicit launch (not a kernel variant's, not the default's)."""
    return [row for row in rows if "launch" in row and "variant" not in row]


def cells(records: list[dict]) -> dict[tuple, dict[tuple, float]]:
    """{(model, batch, kv, tokens, form): {launch: us}} over the launch rows of each record
    (checked by load_record)."""
    out: dict[tuple, dict[tuple, float]] = {}
    for rec in records:
        for row in launch_rows(rec["attention"]):
            key = (rec["model"], row["batch"], row["kv"], row["tokens"], row["form"])
            out.setdefault(key, {})[tuple(row["launch"])] = row["us"]
    return out


def load_record(path: Path) -> dict:
    """A component_bench record with launch rows, every field the judgement reads checked:
    ValueError (one line) otherwise."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(record, dict) or not isinstance(record.get("model"), str):
        raise ValueError("not a component_bench record (no model)")
    resolve_model(record["model"])
    rows = record.get("attention")
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError("no attention rows")
    launched = launch_rows(rows)
    if not launched:
        raise ValueError("no launch rows (run component_bench.py with --attention-launches)")
    for i, row in enumerate(launched):
        for name, kind in ROW_FIELDS:
            if not isinstance(row.get(name), kind) or isinstance(row.get(name), bool):
                raise ValueError(f"attention row {i}: {name} missing or not {kind.__name__}")
        launch, us = row["launch"], row.get("us")
        if not (isinstance(launch, list) and len(launch) == 6 and all(isinstance(x, int) for x in launch)):
            raise ValueError(f"attention row {i}: launch is not six integers")
        if not isinstance(us, (int, float)) or isinstance(us, bool) or not 0 < us < math.inf:
            raise ValueError(f"attention row {i}: us is not a positive time")
    return record


def judge(records: list[dict], slack: float) -> dict:
    """Per cell: the rule's, the rule before's and the fastest launch with their times."""
    rows_out, missing = [], []
    for (model, b, kv, n, form), times in sorted(cells(records).items()):
        spec = resolve_model(model)
        rows = n * spec.attn_group
        now = ca.attention_launch(b, spec.attn_kv_heads, rows, attention_max_keys(kv, n, form), form == "tree")
        before = rule_before(b, spec.attn_kv_heads, rows)
        best = min(times, key=times.get)
        if now not in times or before not in times:
            missing.append((model, b, kv, n, form))
            continue
        rows_out.append({"model": model, "batch": b, "kv": kv, "tokens": n, "form": form, "rows": rows,
                         "rule": list(now), "rule_us": times[now], "before": list(before),
                         "before_us": times[before], "best": list(best), "best_us": times[best],
                         "rule_over_best": times[now] / times[best],
                         "rule_over_before": times[now] / times[before]})
    over_best = [r["rule_over_best"] for r in rows_out] or [math.nan]
    over_before = [r["rule_over_before"] for r in rows_out] or [math.nan]
    return {"cells": rows_out, "missing": missing, "slack": slack, "rule": ca.LAUNCH_RULE,
            "geomean_rule_over_best": statistics.geometric_mean(over_best),
            "geomean_rule_over_before": statistics.geometric_mean(over_before),
            "worst_rule_over_best": max(over_best),
            "range_rule_over_before": [min(over_before), max(over_before)]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="component_bench attention sweep records (JSON)")
    ap.add_argument("--slack", type=float, default=0.05, help="list cells where the rule is this far off the fastest")
    ap.add_argument("--json", type=Path, default=None, help="write the judgement here too")
    ap.add_argument("--one-tile-min-keys", type=int, default=None, metavar="KEYS",
                    help="what if the rule's one-tile threshold were KEYS (kernels.cache_attention."
                         "ONE_TILE_MIN_KEYS; the shipped value without it; a two-tile tree's half and "
                         "the batched quarter scale with it)")
    args = ap.parse_args(argv)
    if args.one_tile_min_keys is not None:
        if args.one_tile_min_keys < 0:
            ap.error(f"--one-tile-min-keys: expected keys >= 0, got {args.one_tile_min_keys}")
        ca.ONE_TILE_MIN_KEYS = args.one_tile_min_keys
    records = []
    for path in args.records:
        try:
            records.append(load_record(path))
        except ValueError as exc:
            print(f"error: records {path}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    if args.json and not args.json.parent.is_dir():
        print(f"error: --json {args.json}: no such folder", file=sys.stderr)
        raise SystemExit(2)
    res = judge(records, args.slack)
    if args.one_tile_min_keys is not None:  # LAUNCH_RULE names the shipped threshold
        res["rule"] += (f" (what if: one tile from {args.one_tile_min_keys} keys read again, its half and "
                        "quarter as above)")
    print(textwrap.fill(f"rule: {res['rule']}", 80, subsequent_indent="  "))
    print(f"{'model':9s} {'b':>2s} {'kv':>5s} {'n':>2s} {'form':7s} {'rule':>8s} {'S9-f':>8s} {'best':>8s}  "
          "best launch")
    for r in res["cells"]:
        if r["rule_over_best"] > 1 + args.slack or r["rule_over_before"] > 1 + args.slack:
            name = r["model"].split("-")[-1]
            print(f"{name:9s} {r['batch']:2d} {r['kv']:5d} {r['tokens']:2d} {r['form']:7s} {r['rule_us']:8.1f} "
                  f"{r['before_us']:8.1f} {r['best_us']:8.1f}  {'x'.join(map(str, r['best']))}")
    print(f"{len(res['cells'])} cells ({len(res['missing'])} without the rule's launch)")
    print(f"rule / fastest: geomean {res['geomean_rule_over_best']:.3f}, worst {res['worst_rule_over_best']:.3f}")
    low, high = res["range_rule_over_before"]
    print(f"rule / S9-f's: geomean {res['geomean_rule_over_before']:.3f}, {low:.3f}-{high:.3f}")
    if args.json:
        atomic_write_text(args.json, json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
