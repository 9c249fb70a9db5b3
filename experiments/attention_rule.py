"""How the cache attention's launch rule (kernels.cache_attention.attention_launch) fares on a
launch sweep: component_bench.py's attention records with --attention-launches, one or more
files (a model each). For each (model, batch, kv, tokens, form) cell it prices the rule's
launch, the rule before S15-b (S9-f's, frozen here) and the fastest launch swept, and prints
the cells where the rule is more than --slack slower than the fastest or S9-f's, then the
geomeans. A cell whose rule launch was not swept is counted as missing, never guessed.

    python experiments/attention_rule.py experiments/results/components/h100-27b-attention-rows-tile-s15.json \
        experiments/results/components/h100-9b-attention-rows-tile-s15.json

Index of experiments: experiments/README.md (S16-a, S16-b; the H200's sweep is owed by
experiments/owed_h200.sh attention).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bole_cli.catalog.models import resolve_model  # noqa: E402
from bole_cli.kernels import cache_attention as ca  # noqa: E402


def rule_before(batch: int, kv_heads: int, rows: int, max_keys: int) -> tuple[int, ...]:
    """The S9-f rule, the one before S15-b and S16 (experiments/README.md), kept here frozen
    as what the rule's later branches are judged against: 16-row tiles but where 64 rows'
    tiles alone fill the GPU."""
    tiles = batch * kv_heads * -(-rows // 16)
    if rows <= ca.FEW_ROWS or tiles < ca.FEW_PROGRAMS:
        return ca.FEW_ROWS_LAUNCH
    return ca.FULL_LAUNCH if tiles >= ca.TARGET_PROGRAMS and rows >= ca.FULL_LAUNCH[5] else ca.MANY_ROWS_LAUNCH


def max_keys(kv: int, tokens: int, form: str) -> int:
    """The bound component_bench gives the kernel (the runtime's): the cache, plus a tree's or
    drafter level's own keys."""
    return kv if form == "decode" else kv + tokens


def cells(records: list[dict]) -> dict[tuple, dict[tuple, float]]:
    """{(model, batch, kv, tokens, form): {launch: us}} over the launch rows of each record."""
    out: dict[tuple, dict[tuple, float]] = {}
    for rec in records:
        for row in rec.get("attention", []):
            if "launch" not in row or "variant" in row:
                continue
            key = (rec["model"], row["batch"], row["kv"], row["tokens"], row["form"])
            out.setdefault(key, {})[tuple(row["launch"])] = row["us"]
    return out


def judge(records: list[dict], slack: float) -> dict:
    """Per cell: the rule's, the rule before's and the fastest launch with their times."""
    rows_out, missing = [], []
    for (model, b, kv, n, form), times in sorted(cells(records).items()):
        spec = resolve_model(model)
        rows = n * spec.attn_group
        mk = max_keys(kv, n, form)
        now = ca.attention_launch(b, spec.attn_kv_heads, rows, mk)
        before = rule_before(b, spec.attn_kv_heads, rows, mk)
        best = min(times, key=times.get)
        if now not in times or before not in times:
            missing.append((model, b, kv, n, form))
            continue
        rows_out.append({"model": model, "batch": b, "kv": kv, "tokens": n, "form": form, "rows": rows,
                         "rule": list(now), "rule_us": times[now], "before": list(before),
                         "before_us": times[before], "best": list(best), "best_us": times[best],
                         "rule_over_best": times[now] / times[best],
                         "rule_over_before": times[now] / times[before]})

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    return {"cells": rows_out, "missing": missing, "slack": slack,
            "rule": ca.LAUNCH_RULE,
            "geomean_rule_over_best": geomean([r["rule_over_best"] for r in rows_out]),
            "geomean_rule_over_before": geomean([r["rule_over_before"] for r in rows_out]),
            "worst_rule_over_best": max((r["rule_over_best"] for r in rows_out), default=float("nan")),
            "range_rule_over_before": [min((r["rule_over_before"] for r in rows_out), default=float("nan")),
                                       max((r["rule_over_before"] for r in rows_out), default=float("nan"))]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="component_bench attention sweep records (JSON)")
    ap.add_argument("--slack", type=float, default=0.05, help="list cells where the rule is this far off the fastest")
    ap.add_argument("--json", type=Path, default=None, help="write the judgement here too")
    args = ap.parse_args(argv)
    records = []
    for path in args.records:
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or "model" not in record:
                raise ValueError("not a component_bench record (no model)")
            resolve_model(record["model"])
        except (OSError, ValueError) as exc:
            print(f"error: records {path}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        records.append(record)
    res = judge(records, args.slack)
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
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
