"""The decision check on the GPU it runs on: does `bole calibrate`'s decision pick (within 5%) the
fastest configuration `bole bench e2e` measures when it sweeps the same choices, and does
it predict its tokens/s (within 15%)?

One run: `bole calibrate --measure` for the model at the given batches and context (into
a cache folder of its own, so that `bole bench e2e` prices its runs with that profile), or
a given measured profile; then, per acceptance preset, the decision re-made from the
profile's costs under that preset (bole_cli.calibrate.decision.decide, as calibrate makes
it), and per batch one `bole bench e2e` over chain depths 1..8, the tree shapes of
--tree-shapes plus the decided one, at budgets around the decided one; then the verdict
per (preset, batch).

    python experiments/check_decision.py --model 9b --batch 1,4,16 --context 4096 --out DIR
    python experiments/check_decision.py --model 9b --profile profiles/h200/Qwen3.5-9B.yaml \
        --acceptance paper-mbpp,paper-cnndm --out DIR
    python experiments/check_decision.py --model 9b --draft-vocab 32768 --out DIR  # a hot-token head

Writes DIR/check.json (the verdicts, the commands) beside the calibrate and e2e outputs;
prints a table last. GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run(cmd: list[str], env: dict, log: Path, timeout: int) -> int:
    """Run cmd, its output appended to log. Past `timeout` it gets SIGINT first (`bole`
    writes the runs it measured, then exits 130), and is killed only if it has not ended
    30 s later."""
    import signal

    print("+", " ".join(cmd), flush=True)
    with log.open("a") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            f.write(f"timed out after {timeout} s\n")
            return 124


def gpu_here() -> str:
    """The catalogue key of the CUDA device present, else what it is ('no CUDA GPU', or its
    name, not in the catalogue)."""
    from bole_cli.catalog.hardware import detect_gpu

    gpu = detect_gpu()
    if gpu is None:
        return "no CUDA GPU"
    return gpu.spec.key if gpu.spec is not None else f"{gpu.name} (not in the catalogue)"


def e2e_args(args, preset: str, b: int, shapes: set, budgets: list[int], tag: str) -> list[str]:
    """`bole bench e2e`'s arguments for one (preset, batch): chain depths 1-8 where --decoders
    has a chain decoder (the command refuses them otherwise)."""
    from bole_cli.bench.e2e.options import CHAIN_DECODERS

    chains = any(d.strip() in CHAIN_DECODERS for d in args.decoders.split(","))
    return (["bench", "e2e", "--model", args.model, "--batch", str(b), "--context", str(args.context),
             "--acceptance", preset, "--decoders", args.decoders]
            + (["--chain-depths", "1,2,3,4,5,6,7,8"] if chains else [])
            + ["--tree-shapes", ",".join(f"{x}x{y}" for x, y in sorted(shapes)),
               "--tree-budgets", ",".join(map(str, budgets)),
               "--steps", str(max(args.steps, -(-args.samples // b))),
               "--warmup", "2", "--no-max-batch", "--out-dir", str(args.out), "--tag", tag]
            + (["--draft-vocab", str(args.draft_vocab)] if args.draft_vocab is not None else []))


def e2e_results(folder: Path, tag: str, since: float) -> "Path | None":
    """The results this run of `bole bench e2e` wrote: TAG.json, or TAG-partial.json past
    its timeout (interrupted), or TAG-failed.json when nothing ran; the newest of them
    written since `since`, never an earlier check's file in the same folder."""
    written = [p for p in (folder / f"{tag}{end}.json" for end in ("", "-partial", "-failed"))
               if p.exists() and p.stat().st_mtime >= since - 1]
    return max(written, key=lambda p: p.stat().st_mtime) if written else None


def budgets_around(n: int, batch: int, per_request: int, factors=(0.5, 2.0)) -> list[int]:
    """The decided budget and its neighbours at `factors` times it, within what a batch
    of these trees can hold."""
    out = {n}
    for f in factors:
        m = int(round(n * f))
        if batch < m <= batch * per_request:
            out.add(m)
    return sorted(out)


def redecide(profile: dict, preset: str, batch: int, context: int):
    """The decision for (batch, context) made from the profile's measured costs under
    `preset`, as `bole calibrate` makes it."""
    from bole_cli.calibrate.acceptance import load_acceptance
    from bole_cli.calibrate.decision import BucketCosts, decide

    entry = next(c for c in profile["configs"] if c["batch"] == batch and c["kv_len"] == context)
    costs = BucketCosts(batch, entry["kv_len"], entry["t_dec"], entry["n"], entry["t_ver"],
                        entry["draft_level"], entry["sample"]["fixed"], entry["sample"]["per_token"])
    return decide(costs, load_acceptance(preset)).to_dict()


def check_one(args, env: dict, log: Path, bole: list[str], profile: dict, preset: str, b: int) -> dict:
    """One (preset, batch): the decision, the e2e sweep around it, the verdict."""
    from bole_cli.trees.generators import beam_tree_size

    d = redecide(profile, preset, b, args.context)
    tree = d["best"].get("tree")
    shapes = {tuple(int(x) for x in s.split("x")) for s in args.tree_shapes.split(",")}
    if tree:
        shapes.add((tree["depth"], tree["topk"]))
    per_request = max(beam_tree_size(x, y) for x, y in shapes)
    n = tree["budget"] if tree else 8 * b
    budgets = budgets_around(n, b, per_request, [float(f) for f in args.budget_factors.split(",")])
    tag = f"e2e-{preset}-b{b}"
    e2e = bole + e2e_args(args, preset, b, shapes, budgets, tag)
    started = time.time()
    rc = run(e2e, env, log, args.e2e_timeout)
    path = e2e_results(args.out, tag, started)
    data = json.loads(path.read_text()) if path else {}
    runs = [r for r in data.get("results", []) if r.get("tok_s")]
    if not runs:
        return {"acceptance": preset, "batch": b, "error": f"bench e2e exit {rc}, no run measured"}
    best = max(runs, key=lambda r: r["tok_s"])
    ch = d["chosen"]

    def matches(r):
        if ch["mode"] == "none":
            return r["decoder"] == "ar"
        if ch["mode"] == "chain":
            return r["decoder"] == "bole-chain" and r["chain_depth"] == ch["depth"]
        return (r["decoder"] == "bole" and r.get("tree_shape") == [ch["depth"], ch["topk"]]
                and r["budget"] == ch["budget"])

    decided = next((r for r in runs if matches(r)), None)
    v = {"acceptance": preset, "batch": b, "decided": ch["label"], "predicted_tok_s": ch["tok_s"],
         # cut short (a timeout's SIGINT): "best" is the best of the runs measured before it
         "partial": bool(data.get("interrupted")) or rc != 0,
         "best": {k: best.get(k) for k in ("decoder", "chain_depth", "tree_shape", "budget",
                                           "tok_s", "predicted_tok_s", "phase_ms", "step_ms")}}
    if decided is not None:
        v.update(measured_tok_s=decided["tok_s"], decided_phase_ms=decided["phase_ms"],
                 decided_step_ms=decided["step_ms"], predicted_step_ms=1e3 * ch["step_s"],
                 step_error=1e3 * ch["step_s"] / decided["step_ms"] - 1,
                 accepted=decided["mean_accepted"], expected_accepted=decided["expected_accepted"],
                 within_5pct_of_best=decided["tok_s"] >= 0.95 * best["tok_s"],
                 prediction_error=ch["tok_s"] / decided["tok_s"] - 1,
                 within_15pct=abs(ch["tok_s"] / decided["tok_s"] - 1) <= 0.15,
                 decided_vs_best=decided["tok_s"] / best["tok_s"])
    else:
        v["error"] = "the decided configuration was not among the e2e runs"
    return v


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="9b")
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--acceptance", default="paper-mbpp", help="presets, comma-separated")
    ap.add_argument("--tree-shapes", default="3x2,4x2,4x4,6x2,6x4,8x2,8x4",
                    help="tree shapes swept beside the decided one")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=8, help="timed steps at the largest batch; smaller "
                    "batches run more, so every run draws at least --samples request-steps")
    ap.add_argument("--samples", type=int, default=128, help="request-steps per run at least (the "
                    "simulated acceptance's sampling error falls as their square root)")
    ap.add_argument("--decoders", default="ar,bole,bole-chain")
    ap.add_argument("--budget-factors", default="0.5,2", help="budgets swept: these times the decided one")
    ap.add_argument("--calibrate-timeout", type=int, default=200)
    ap.add_argument("--e2e-timeout", type=int, default=150)
    ap.add_argument("--profile", type=Path, help="a measured profile to check instead of "
                    "calibrating here (copied into the run's cache folder, under its own GPU)")
    ap.add_argument("--gpu", default="h200", help="the catalogue GPU calibrate measures as (without --profile)")
    ap.add_argument("--draft-vocab", type=int, help="the drafter's hot tokens (calibrate and bench e2e "
                    "--draft-vocab); with --profile, the profile's")
    args = ap.parse_args()
    profile = None
    if args.profile is not None:
        import yaml

        profile = yaml.safe_load(args.profile.read_text())
        here = gpu_here()
        if here != profile["gpu"]:  # bench e2e prices its runs with the profile of the card it runs on
            print(f"error: --profile: a profile of {profile['gpu']}, and this machine has {here}")
            return 2
        from bole_cli.catalog.models import resolve_model
        from bole_cli.parsing import check_draft_vocab
        from bole_cli.profiles import draft_vocab_of, drafter_words

        vocab = resolve_model(args.model).vocab
        priced = draft_vocab_of(profile, vocab)
        if args.draft_vocab is not None and check_draft_vocab(args.draft_vocab, vocab) != priced:
            print(f"error: --draft-vocab {args.draft_vocab}: the profile priced {drafter_words(priced)}")
            return 2
        args.draft_vocab = priced  # bench e2e runs the head the profile priced
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = out / "check.log"
    env = dict(os.environ, BOLE_CACHE_DIR=str(out / "cache"), COLUMNS="120")
    bole = [sys.executable, "-m", "bole_cli"]
    batches = [int(b) for b in args.batch.split(",")]
    cal_json = out / "calibrate.json"
    cal = bole + ["calibrate", "--gpu", args.gpu, "--model", args.model, "--measure",
                  "--batch", args.batch, "--kv", str(args.context), "--repeats", "5",
                  "--warmup", "2", "--acceptance", args.acceptance.split(",")[0], "--no-plot", "--json"]
    if args.draft_vocab is not None:
        cal += ["--draft-vocab", str(args.draft_vocab)]
    if profile is not None:
        import shutil

        from bole_cli.profiles import profile_path

        # where bench e2e looks for this GPU, model and drafter (a hot-token head's own name)
        dest = profile_path(out / "cache" / "profiles", str(profile["gpu"]), str(profile["model"]), args.draft_vocab)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.profile, dest)
        cal = ["(given)", str(args.profile)]
    else:
        print("+", " ".join(cal), flush=True)
        with cal_json.open("w") as f:
            rc = subprocess.run(cal, env=env, stdout=f, stderr=open(log, "a"),
                                timeout=args.calibrate_timeout).returncode
        if rc != 0:
            print(f"calibrate failed ({rc}); see {log}")
            return 1
        profile = json.loads(cal_json.read_text())["profile"]
    verdicts = []
    for preset in args.acceptance.split(","):
        for b in batches:
            verdicts.append(check_one(args, env, log, bole, profile, preset, b))
    doc = {"model": args.model, "context": args.context, "acceptance": args.acceptance.split(","),
           "calibrate": " ".join(cal[2:]), "verdicts": verdicts}
    (out / "check.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'preset':<12} {'B':>3} {'decided':<16} {'pred':>6} {'meas':>6} {'err':>5} {'step':>5} "
          f"{'acc/exp':>7} {'best':<18} {'vs best':>7}")
    for v in verdicts:
        if "measured_tok_s" not in v:
            print(f"{v['acceptance']:<12} {v['batch']:>3} {v.get('decided', '-'):<16} {v.get('error')}")
            continue
        bst = v["best"]
        what = (f"chain d{bst['chain_depth']}" if bst["chain_depth"] else
                "tree {}x{} N{}".format(*bst["tree_shape"], bst["budget"]) if bst["tree_shape"]
                else bst["decoder"])
        print(f"{v['acceptance']:<12} {v['batch']:>3} {v['decided']:<16} {v['predicted_tok_s']:>6.0f} "
              f"{v['measured_tok_s']:>6.0f} {v['prediction_error'] * 100:>+4.0f}% "
              f"{v['step_error'] * 100:>+4.0f}% {v['accepted'] / v['expected_accepted']:>7.3f} {what:<18} "
              f"{v['decided_vs_best']:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
