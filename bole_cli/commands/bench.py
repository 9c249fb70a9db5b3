"""`bole bench kernels` and `bole bench e2e`: options in, one library run, its tables out.

The work and the rendering live in the library: bole_cli/bench/kernel_bench.py and
kernel_report.py (kernels), bole_cli/bench/e2e/ (e2e), bole_cli/bench/results.py (files).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from bole_cli.bench.e2e import options as e2e
from bole_cli.bench.results import check_outputs, check_stem_free, result_stem, write_results
from bole_cli.calibrate.acceptance import DEFAULT_PRESET, PRESET_TARGETS
from bole_cli.commands import DRAFT_VOCAB_HELP, int_option, path_value
from bole_cli.errors import BoleError, InputError
from bole_cli.memory import FLOAT_DTYPES
from bole_cli.limits import (KERNEL_STATE_DTYPES, MAX_BATCH_REQUESTS, MAX_TREE_NODES, SERVED_VERIFY_PRECISION,
                             VERIFY_PRECISIONS)
from bole_cli.parsing import parse_int_list, parse_name_list
from bole_cli.paths import PARTIAL

bench_app = typer.Typer(help="Benchmarks: kernels (CUDA) and end to end (CUDA, or a CPU smoke "
                             "run with --device cpu --tiny).", no_args_is_help=True)
OUT_DIR_HELP = ("Where the JSON and PNG go \\[the cache: ~/.cache/bole/results]; the "
                "repository's records: experiments/results.")


def _say_written(json_path: Path, json_out: bool, plotted: bool) -> None:
    """Where the results went, a path a line (a path is never broken, so a line holds one
    whole path and no more), the plot only where this run drew one: on stderr under --json
    (stdout holds the data)."""
    from bole_cli.console import err, out

    png = json_path.with_suffix(".png")
    (err if json_out else out).print(f"wrote {json_path}" + (f"\n  and {png}" if plotted else ""),
                                     markup=False, soft_wrap=True)


def _need_cuda(why: str) -> None:
    """Refuse without CUDA: without a driver at once, before torch's import."""
    from bole_cli.catalog.hardware import cuda_driver_missing

    if cuda_driver_missing():
        raise BoleError(why)
    import torch

    if not torch.cuda.is_available():
        raise BoleError(why)


def kernels_cmd(
    model: str = typer.Option("9b", "--model", "-m", help="Model whose GDN shape to use."),
    batch: str = typer.Option("1,4,16,64", "--batch", help="Batch sizes."),
    nodes: str = typer.Option("8,16,32,64,128,192,256", "--nodes", help="Tree nodes per request."),
    trees: str = typer.Option("random,chain", "--trees", help="random (depth <= 8) and/or chain (chains also "
                              "time SGLang's ReplaySSM ring and Bole's deferred write)."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Activation dtype: bfloat16, float16, float32."),
    state_dtype: str = typer.Option("float32", "--state-dtype", help="State pool dtype: float32 or bfloat16."),
    precision: str = typer.Option("auto", "--precision",
                                  help="Verify dots: auto (as served: tf32 for 16-bit activations, "
                                       "tf32x3 for float32), tf32, split (u exact, the readout at "
                                       "tf32; unmeasured), tf32x3, ieee."),
    no_sglang: bool = typer.Option(False, "--no-sglang", help="Time Bole alone (no SGLang baseline)."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", parser=path_value, metavar="DIR", help=OUT_DIR_HELP),
    tag: Optional[str] = typer.Option(None, "--tag", help="File name stem (default: kernels-<gpu>-<model>)."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Time SGLang's serial tree verify + snapshot copy-back against Bole's closed form + commit."""
    from bole_cli.catalog.models import resolve_model
    from bole_cli.console import emit_json, err, invoked_command, out

    out_dir = check_outputs(out_dir, tag)
    spec = resolve_model(model)
    batches = parse_int_list(batch, "--batch", maximum=MAX_BATCH_REQUESTS)
    node_list = parse_int_list(nodes, "--nodes", maximum=MAX_TREE_NODES)
    tree_kinds = parse_name_list(trees, "--trees")
    if [t for t in tree_kinds if t not in ("random", "chain")]:
        raise InputError(f"--trees: expected random and/or chain, got {trees!r}")
    for name, value, allowed in (("--dtype", dtype, tuple(FLOAT_DTYPES)),
                                 ("--state-dtype", state_dtype, KERNEL_STATE_DTYPES)):
        if value not in allowed:
            raise InputError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    if precision not in ("auto",) + VERIFY_PRECISIONS:
        raise InputError(f"--precision: expected auto or one of {', '.join(VERIFY_PRECISIONS)}, got {precision!r}")
    _need_cuda("bole bench kernels needs a CUDA GPU (timings on CPU would mean nothing)")
    import torch

    device_name = "" if tag else torch.cuda.get_device_name()  # a --tag is the stem itself
    check_stem_free(out_dir, tag, "kernels", device_name, spec.name)
    from bole_cli.bench import kernel_report
    from bole_cli.bench.kernel_bench import run_kernel_bench

    started = time.time()
    with err.status("benchmarking") as status:
        result = run_kernel_bench(spec, batches, node_list, tree_kinds, act_dtype=dtype, state_dtype=state_dtype,
                                  with_sglang=not no_sglang,
                                  precision=SERVED_VERIFY_PRECISION if precision == "auto" else precision,
                                  progress=lambda msg: status.update(f"benchmarking: {msg}"))
    from bole_cli.interrupts import held

    with held() as section:  # a Ctrl-C now waits until the results are written
        data = kernel_report.kernel_document(result, dtype=dtype, state_dtype=state_dtype, precision=precision,
                                             command=invoked_command(),
                                             seconds=time.time() - started)
        json_path = write_results(data, (lambda path: kernel_report.plot(result, path)) if result.cases else None,
                                  out_dir,
                                  result_stem(tag, "kernels", result.device, spec.name,
                                              incomplete=PARTIAL if result.interrupted else ""))
    result.interrupted |= section.interrupted
    if json_out:
        emit_json(data)
    else:
        for t in kernel_report.tables(result, out.width):
            out.print(t)
        for line in kernel_report.notes(result, data):
            out.print(line, markup=False)
    _say_written(json_path, json_out, plotted=bool(result.cases))
    if result.interrupted:
        if result.disagreements:
            err.print(f"{len(result.disagreements)} measured cell(s) where SGLang's and Bole's results "
                      f"disagree (first: {result.disagreements[0]})", markup=False)
        err.print(f"interrupted: the {len(result.cases)} cell(s) measured before it are in {json_path}",
                  markup=False, soft_wrap=True)
        raise KeyboardInterrupt
    if result.disagreements:
        raise BoleError(f"{len(result.disagreements)} cell(s) where SGLang's and Bole's results disagree "
                        f"(first: {result.disagreements[0]}); see {json_path}")


bench_app.command("kernels")(kernels_cmd)


def e2e_cmd(
    model: str = typer.Option(e2e.MODEL, "--model", "-m", help="Model whose shapes to build (random weights)."),
    batch: Optional[str] = typer.Option(None, "--batch",
                                        help=f"Batch sizes, comma-separated {e2e.default_note('batch')}."),
    context: Optional[int] = int_option(None, "--context", help="Committed tokens per request (KV cache) "
                                                                f"{e2e.default_note('context')}."),
    budget: str = typer.Option(e2e.BUDGET, "--budget",
                               help="Tree tokens verified per step over the whole batch: 'profile' (the tree "
                                    "budget of the decision in this GPU and model's calibration profile; "
                                    "B_ver where it has none) or a number."),
    acceptance: str = typer.Option(DEFAULT_PRESET, "--acceptance",
                                   help=f"SIMULATED acceptance: {', '.join(PRESET_TARGETS)}, a per-depth "
                                        "acceptance file, or 'greedy' (accept iff the draft equals the target's "
                                        "argmax)."),
    depth: Optional[int] = int_option(None, "--depth",
                                      help=f"Draft tree depth (drafter passes) {e2e.default_note('depth')}."),
    topk: Optional[int] = int_option(None, "--topk", help="Drafts per expanded node (beam width) "
                                                          f"{e2e.default_note('topk')}."),
    steps: Optional[int] = int_option(None, "--steps", help="Timed steps per decoder and batch "
                                                            f"{e2e.default_note('steps')}."),
    warmup: Optional[int] = int_option(None, "--warmup", help="Untimed steps first (graph capture) "
                                                              f"{e2e.default_note('warmup')}."),
    decoders: Optional[str] = typer.Option(None, "--decoders", help=e2e.decoders_help()),
    chain_depths: Optional[str] = typer.Option(None, "--chain-depths",
                                               help="Depths the chain decoders sweep, best reported "
                                                    f"{e2e.default_note('chain_depths')}."),
    tree_budgets: Optional[str] = typer.Option(None, "--tree-budgets",
                                               help="Batch budgets the tree decoders sweep, best reported "
                                                    "(instead of --budget)."),
    tree_shapes: Optional[str] = typer.Option(None, "--tree-shapes", metavar="DxK,...",
                                              help="Draft tree shapes (depth x top-k) the tree decoders "
                                                   "sweep, best reported [--depth x --topk]."),
    draft_vocab: Optional[int] = int_option(None, "--draft-vocab", help=DRAFT_VOCAB_HELP),
    snapshot_engine: str = typer.Option(e2e.SNAPSHOT_ENGINE, "--snapshot-engine",
                                        help="Snapshot verify: auto (SGLang's kernels where they load), "
                                             "sglang, torch."),
    max_batch: int = int_option(e2e.MAX_BATCH, "--max-batch", help="Upper end of the largest-batch search."),
    max_probes: int = int_option(e2e.MAX_PROBES, "--max-probes", help="Batches tried per decoder in that search."),
    probe_nodes: Optional[int] = int_option(None, "--probe-nodes",
                                            help="Tree tokens per request in that search (default: the "
                                                 "per-request tree at the smallest --batch)."),
    no_max_batch: bool = typer.Option(False, "--no-max-batch", help="Skip the largest-batch search."),
    dtype: str = typer.Option(e2e.DTYPE, "--dtype",
                              help=f"Activations: auto ({e2e.AUTO_DTYPE['cuda']} on CUDA, {e2e.AUTO_DTYPE['cpu']} "
                                   f"on CPU), {', '.join(FLOAT_DTYPES)}."),
    device: str = typer.Option(e2e.DEVICE, "--device", help="cuda, or cpu with --tiny (a smoke run)."),
    tiny: bool = typer.Option(False, "--tiny", help="A tiny 8-layer hybrid model instead of --model (smoke runs)."),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="Run eagerly (no CUDA graphs)."),
    seed: int = int_option(e2e.SEED, "--seed", help="Weights, prompts and the acceptance draws."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", parser=path_value, metavar="DIR", help=OUT_DIR_HELP),
    tag: Optional[str] = typer.Option(None, "--tag", help="File name stem (default: e2e-<gpu>-<model>)."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Autoregressive vs snapshot-tree vs Bole decoding end to end (acceptance simulated, costs measured)."""
    from bole_cli.console import emit_json, err, invoked_command, out

    out_dir = check_outputs(out_dir, tag)
    cfg = e2e.check_options(model=model, tiny=tiny, batch=batch, context=context, depth=depth, topk=topk,
                        steps=steps, warmup=warmup, decoders=decoders, chain_depths=chain_depths,
                        budget=budget, acceptance=acceptance, tree_budgets=tree_budgets,
                        tree_shapes=tree_shapes, draft_vocab=draft_vocab, snapshot_engine=snapshot_engine,
                        max_batch=max_batch, max_probes=max_probes, probe_nodes=probe_nodes,
                        search=not no_max_batch, dtype=dtype, device=device, graphs=not no_graphs, seed=seed,
                        command=invoked_command())
    if device == "cuda":
        _need_cuda("bole bench e2e needs a CUDA GPU (timings on CPU would mean nothing); "
                   "for a smoke run use --device cpu --tiny")
        import torch

        device_name = "" if tag else torch.cuda.get_device_name()  # a --tag is the stem itself
    else:
        device_name = "cpu"
    check_stem_free(out_dir, tag, "e2e", device_name, "tiny" if tiny else cfg.spec.name)
    from bole_cli.bench.e2e.sweep import run_e2e
    from bole_cli.bench.e2e.report import notes, plot, tables

    from bole_cli.interrupts import held

    with err.status("bole bench e2e") as status:
        data = run_e2e(cfg, progress=lambda msg: status.update(f"bole bench e2e: {msg}"))
    measured = [r for r in data["results"] if not r["error"]]
    with held() as section:  # a Ctrl-C now waits until the results are written
        incomplete = PARTIAL if data["interrupted"] else "" if measured or not data["results"] else "failed"
        json_path = write_results(data, (lambda path: plot(data, path)) if measured else None, out_dir,
                                  result_stem(tag, "e2e", data["device"], "tiny" if tiny else cfg.spec.name,
                                              incomplete=incomplete))
    interrupted = data["interrupted"] or section.interrupted
    if json_out:
        emit_json(data)
    else:
        for t in tables(data, out.width):
            out.print(t)
        for line in notes(data):
            out.print(line, markup=False)
    _say_written(json_path, json_out, plotted=bool(measured))
    if interrupted:
        err.print(f"interrupted: the {len(data['results'])} run(s) measured before it are in {json_path}",
                  markup=False, soft_wrap=True)
        raise KeyboardInterrupt
    if data["results"] and not measured:
        raise BoleError(f"no run was measured: {len(data['results'])} failed (first: "
                        f"{data['results'][0]['error']}); see {json_path}")
    exact = data.get("greedy_exact")
    if exact is not None and not exact["identical"]:
        why = (exact["mismatches"] or exact["failed"] or ["no two decoders ran to compare"])[0]
        raise BoleError(f"greedy exactness failed: {why}; see {json_path}")


bench_app.command("e2e")(e2e_cmd)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
