"""The kept experiments stay runnable (experiments/README.md): every superseded kernel
variant is a text edit of a shipped kernel, and an edit that no longer applies (the shipped
kernel changed under it) must fail loudly here, not on the GPU machine."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from experiment_modules import EXPERIMENTS, experiment_module


def _kernel_variants():
    return experiment_module("kernel_variants")


def test_every_variant_edit_applies_to_the_shipped_kernels():
    env = dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent), TRITON_INTERPRET="1")  # as on the device
    run = subprocess.run([sys.executable, str(EXPERIMENTS / "ab_kernels.py"), "--check"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_edit_that_no_longer_applies_fails():
    variants = _kernel_variants()
    site = next(iter(variants.VARIANTS.values())).site
    with pytest.raises(ValueError, match="edit no longer applies"):
        variants.edited_source(site, [("this text is in no kernel", "")])


def test_a_span_edit_replaces_from_its_first_text_through_its_last():
    variants = _kernel_variants()
    site = variants.REPLAY
    src = variants.edited_source(site, [(*variants._R_LOOP, "        pass  # the span\n")])
    assert "        pass  # the span\n" in src and "kt, vt, gt, bt = kn, vn, gn, bn" not in src
    assert "# the root's row" not in src and "store_mask" in src  # what follows the span stays
    with pytest.raises(ValueError, match="edit no longer applies"):
        variants.edited_source(site, [(variants._R_LOOP[0], "this text is in no kernel", "")])


def test_a_variant_is_in_place_only_inside_its_context():
    variants = _kernel_variants()
    site = variants.VARIANTS["no-values"].site
    launcher = importlib.import_module(site.launcher)
    shipped = getattr(launcher, site.attr)
    edited = variants.load_variant("no-values")
    with variants.kernel_in_place(site, edited):
        assert getattr(launcher, site.attr) is edited is not shipped
    assert getattr(launcher, site.attr) is shipped


def test_compile_stats_reads_the_sm90_compile(tmp_path):
    """compile_stats.py compiles a verify kernel for sm_90 on this machine (no GPU) and reads
    ptxas's registers and spill bytes; a spec of the wrong length is refused by name."""
    import glob

    import triton

    if not glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*")):
        pytest.skip("this Triton install ships no ptxas")
    out = tmp_path / "stats.json"
    script = str(EXPERIMENTS / "compile_stats.py")
    run = subprocess.run([sys.executable, script, "tile", "16,32,64,32,4,1", "16,128,64,128,4,1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["spec"] for r in rows] == [[16, 32, 64, 32, 4, 1], [16, 128, 64, 128, 4, 1]]
    assert all(0 < r["registers"] <= 255 and r["spill_stores"] >= 0 for r in rows)
    assert rows[1]["registers"] > rows[0]["registers"]  # four times the value tile
    bad = subprocess.run([sys.executable, script, "tile", "16,32"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "six numbers" in bad.stderr
    # the replay commit as launched for a 16-node walk (its row stride a constant, the other
    # strides arguments) against its row stride an argument and against every stride a constant
    regs = {}
    for flags in ((), ("--constant-strides",), ("--row-stride", "arg")):
        run = subprocess.run([sys.executable, script, "replay", "16,16,0,16,1,1", *flags, "--out", str(out)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        regs[flags] = json.loads(out.read_text())["rows"][0]["registers"]
    assert regs[("--row-stride", "arg")] > regs[()] >= regs[("--constant-strides",)]


def smoke_record(tmp_path, script: str, *args: str, timeout: int = 300) -> dict:
    """Run experiments/<script> with args and --out, the package importable as on the device
    (PYTHONPATH, no install) and Triton interpreted (no GPU here); the record it wrote."""
    import json

    out = tmp_path / "record.json"
    env = dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent), TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(EXPERIMENTS / script), *args, "--out", str(out)],
                         capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


def test_the_precision_contract_smoke_run_writes_its_record(tmp_path):
    """experiments/precision_contract.py at tiny shapes under the interpreter: every row
    written, the served state float32-exact (the GPU run is experiments/README.md P-1)."""
    doc = smoke_record(tmp_path, "precision_contract.py", "--device", "cpu", "--smoke", "--no-sglang")
    served = [r for r in doc["rows"] if r["impl"] == "served" and r["state_dtype"] == "float32"]
    assert len(served) == 4 and all(r["state_rms_single"] <= 1e-6 for r in served)
    assert {r["impl"] for r in doc["rows"]} == {"served", "tf32", "split", "tf32x3"}


def test_the_component_bench_smoke_run_writes_its_record(tmp_path):
    """experiments/component_bench.py (the roofline's component factors) at a tiny model on
    CPU: every GEMM shape at each row count, the kernel floor, the host step and the fused
    GDN decode at each batch and the attention at each batch and tokens a request written,
    and the attention rows give calibrate.components.attention_cells a full grid."""
    from bole_cli.calibrate.components import attention_cells

    doc = smoke_record(tmp_path, "component_bench.py", "--device", "cpu", "--smoke", "--decode-launches", "1x8,2x1")
    assert sorted({r["batch"] for r in doc["gdn_decode"]}) == [1, 2] and all(r["us"] > 0 for r in doc["gdn_decode"])
    assert sorted((r["value_split"], r["num_warps"]) for r in doc["gdn_decode"]) == [(1, 8)] * 2 + [(2, 1)] * 2
    assert all(r["max_rel_state"] < 1e-5 and r["max_rel_out"] < 1e-2 for r in doc["gdn_decode"])
    assert sorted((r["batch"], r["tokens"], r["form"]) for r in doc["attention"]) == [
        (1, 1, "decode"), (1, 4, "drafter"), (1, 4, "tree"), (2, 1, "decode"), (2, 4, "drafter"), (2, 4, "tree")]
    assert all(r["us"] > 0 for r in doc["attention"])
    cells = attention_cells(dict(doc, model="9b"))  # priced at a catalogue shape: the grid, not the shares
    grid = [(16.0, 4.0), (16.0, 16.0), (32.0, 4.0), (32.0, 16.0)]  # keys, rows: 1 and 4 tokens x 9B's group of 4
    assert [(keys, rows) for keys, rows, _ in cells] == grid
    drafted = attention_cells(dict(doc, model="9b"), drafter=True)
    assert [(keys, rows) for keys, rows, _ in drafted] == grid
    no_drafter = [r for r in doc["attention"] if r["form"] != "drafter"]
    assert attention_cells(dict(doc, model="9b", attention=no_drafter), drafter=True) == ()
    assert {r["gemm"] for r in doc["gemms"]} == {"gdn_in_proj", "lm_head", "mlp_gate_up", "mlp_down"}
    assert sorted({r["M"] for r in doc["gemms"]}) == [1, 4] and all(r["us"] > 0 for r in doc["gemms"])
    assert doc["kernel_floor"]["us_per_kernel"] > 0 and doc["host_step"]["us_median"] > 0


def test_the_component_bench_times_sglangs_decode_beside_ours(tmp_path, sglang_source):
    """--sglang: SGLang's own decode of a GDN layer (its conv update, then its packed
    recurrent decode, interpreted here) timed beside ours, its state one step on within a
    bf16 rounding of ours (SGLang rounds beta to the activation dtype; ours keeps it float32),
    and only the GDN decode part run (--parts)."""
    doc = smoke_record(tmp_path, "component_bench.py", "--device", "cpu", "--smoke", "--decode-launches", "1x8",
                       "--sglang", "--parts", "gdn_decode")
    theirs = [r for r in doc["gdn_decode"] if r["impl"] == "sglang"]
    assert [r["batch"] for r in theirs] == [1, 2] and all(r["us"] > 0 for r in theirs)
    assert all(0 < r["max_rel_state"] < 2e-2 for r in theirs)
    # its gated RMSNorm (a third launch) counted, so the outputs compare too
    assert all(r["norm"] and r["max_rel_out"] < 2e-2 for r in theirs)
    assert "gemms" not in doc and "attention" not in doc


def test_the_component_bench_times_kernel_variants_and_launches(tmp_path):
    """--decode-variants / --attention-variants time experiments/kernel_variants.py's edits
    beside the shipped kernels, each row checked against the shipped one (an exact edit
    agrees, an ablation does not), and --attention-launches each launch; a variant of
    another kernel is refused before anything runs."""
    import json

    doc = smoke_record(tmp_path, "component_bench.py", "--device", "cpu", "--smoke", "--decode-launches", "1x8",
                       "--parts", "gdn_decode,attention", "--decode-variants", "d-state-last,d-evict,d-no-norm",
                       "--attention-variants", "a-merge-serial", "--attention-launches",
                       "64x4x3x264x256x16,16x4x1x264x16x32")
    variants = {r["variant"]: r for r in doc["gdn_decode"] if r.get("variant") and r["batch"] == 1}
    for exact in ("d-state-last", "d-evict"):
        assert variants[exact]["max_rel_out"] == 0 and variants[exact]["max_rel_state"] == 0, exact
    assert variants["d-no-norm"]["max_rel_out"] > 0.1  # the ablation's output is not the layer's
    decode = [r for r in doc["attention"] if r["form"] == "decode" and r["batch"] == 1]
    assert [r.get("variant") or tuple(r["launch"]) for r in decode] == [
        (64, 4, 3, 264, 256, 16), (16, 4, 1, 264, 16, 32), "a-merge-serial"]
    assert all(r["max_rel_out"] < 1e-5 for r in doc["attention"])
    bad = subprocess.run([sys.executable, str(EXPERIMENTS / "component_bench.py"), "--device", "cpu", "--smoke",
                          "--decode-variants", "a-merge-serial", "--out", str(tmp_path / "bad.json")],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent)))
    assert bad.returncode == 2 and "--decode-variants" in bad.stderr and not (tmp_path / "bad.json").exists()
    assert json.loads((tmp_path / "record.json").read_text())["model"]


def test_the_skinny_mm_bench_smoke_run_writes_its_record(tmp_path):
    """experiments/skinny_mm_bench.py at a tiny model on CPU: every decode projection at each
    row count, cuBLAS beside the kernel's rule and grid, each checked before it is timed,
    and the step's sums."""
    (entry,) = smoke_record(tmp_path, "skinny_mm_bench.py", "--smoke")["models"]
    assert set(entry["gemms"]) == {"lm_head", "gdn_in_proj", "gdn_out_proj", "attn_qkv_proj", "attn_o_proj",
                                   "mlp_gate_up", "mlp_down"}
    assert {r["impl"] for r in entry["rows"]} == {"cublas", "rule", "grid"}
    assert all(r["rel_err"] < 1e-5 for r in entry["rows"])
    assert [s["M"] for s in entry["step"]] == [1, 3] and all(s["best_ms"] <= s["cublas_ms"] for s in entry["step"])
    # the normed projections, unfused (add_rms, GEMM, SwiGLU) against fused, checked alike
    assert {(r["gemm"], r["impl"]) for r in entry["fused"]} == {
        (g, i) for g in ("gdn_in_proj", "attn_qkv_proj", "mlp_gate_up", "lm_head") for i in ("unfused", "fused")}
    assert all(r["rel_err"] < 1e-5 and r["us"] > 0 for r in entry["fused"])
    assert [s["M"] for s in entry["fused_step"]] == [1, 3]


def test_the_launch_count_run_counts_every_step(tmp_path):
    """experiments/launch_count.py on a 4-layer tiny model: each variant's decode, verify
    metadata, forward and commit counted; the fused kernels launch less than the pieces, and
    the metadata and the commit are the one- and four-launch kernels."""
    doc = smoke_record(tmp_path, "launch_count.py", "--layers", "4", "--tree-tokens", "4")
    v = doc["variants"]
    assert set(v) == {"pieces", "production", "skinny"}
    for step in ("decode_forward", "verify_forward"):
        assert v["skinny"][step]["launches"] < v["production"][step]["launches"] < v["pieces"][step]["launches"]
    assert v["production"]["verify_metadata"]["launches"] == 1 and v["production"]["verify_commit"]["launches"] == 4
    assert "triton _attention_in_kernel" in v["production"]["decode_forward"]["by_kind"]


def test_the_runtime_step_bench_smoke_run_writes_its_record(tmp_path):
    """experiments/runtime_step_bench.py at a tiny model on CPU, a variant that names the
    skinny GEMM's projections and its most rows (in_proj, out_proj, o_proj, down and the LM
    head of one-row steps), batch 1: its decode and verify rows, and the launch table it ran."""
    from bole_cli.limits import GDN_DECODE_LAUNCH

    doc = smoke_record(tmp_path, "runtime_step_bench.py", "--smoke", "--variants", "skinny-down1", "--batch", "1",
                       "--repeats", "1", timeout=600)
    assert [(r["variant"], r["batch"]) for r in doc["decode"]] == [("skinny-down1", 1)]
    assert [r["variant"] for r in doc["verify"]] == ["skinny-down1"]
    assert doc["variants"]["skinny-down1"][-1] == 1
    assert [tuple(row) for row in doc["launch_tables"]["skinny-down1"]] == list(GDN_DECODE_LAUNCH)
    assert all(r["replay_ms"] > 0 and r["serving_ms"] > 0 for r in doc["decode"] + doc["verify"])


def test_the_step_bench_decode_variants_set_and_restore_the_launch_table():
    """runtime_step_bench: decode-SxW runs every decode at S x W and the others at the shipped
    table; the record names each variant's table; main() leaves the shipped table behind even
    when a run fails."""
    from types import SimpleNamespace

    from bole_cli import limits

    bench = experiment_module("runtime_step_bench")
    shipped = limits.GDN_DECODE_LAUNCH
    model = SimpleNamespace(set_skinny=lambda *a: None)
    timer = SimpleNamespace(model=model, reset_graphs=lambda: None)
    try:
        bench.set_variant(timer, "decode-8x2")
        assert limits.GDN_DECODE_LAUNCH == ((None, 8, 2),) and limits.gdn_decode_launch(32) == (8, 2)
        bench.set_variant(timer, "production")
        assert limits.GDN_DECODE_LAUNCH == shipped
        bench.set_variant(timer, "decode-1x8")
        with pytest.raises(SystemExit):
            bench.main(["--variants", "decode-4x2", "--no-such-option"])
        assert limits.GDN_DECODE_LAUNCH == shipped
    finally:
        limits.GDN_DECODE_LAUNCH = shipped
    assert bench.launch_table("decode-16x1") == ((None, 16, 1),) and bench.launch_table("cublas") == shipped


def test_the_step_bench_kernel_variants_are_put_in_place_and_back(monkeypatch):
    """runtime_step_bench's attention-s8 runs production with kernel_variants' a-before-s9 in
    the attention's launcher, and the next variant (and main's end) puts the shipped one back."""
    import importlib
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    bench = experiment_module("runtime_step_bench")
    module = importlib.import_module("bole_cli.kernels.cache_attention")
    shipped = module.cache_attention
    timer = SimpleNamespace(model=SimpleNamespace(set_skinny=lambda *a: None), reset_graphs=lambda: None)
    try:
        bench.set_variant(timer, "attention-s8")
        assert module.cache_attention is not shipped and "before_s9" in module.cache_attention.__module__
        assert bench.VARIANTS["attention-s8"] == bench.VARIANTS["production"]
        bench.set_variant(timer, "production")
        assert module.cache_attention is shipped
        bench.set_variant(timer, "attention-s8")
        with pytest.raises(SystemExit):
            bench.main(["--no-such-option"])
        assert module.cache_attention is shipped
    finally:
        module.cache_attention = shipped


def test_the_tf32_emulation_changes_what_the_interpreter_computes(tmp_path):
    """experiments/tf32_emulation.py's patch of the interpreter takes effect: a 64-node chain's
    outputs sit at the bf16 floor with exact dots and above it with tf32 truncation (if a
    Triton upgrade moved the internals it patches, this fails instead of predicting nothing)."""
    (row,) = smoke_record(tmp_path, "tf32_emulation.py", "--smoke")["rows"]
    assert row["o_over_floor_exact"] <= 1.01 < 1.05 <= row["o_over_floor_tf32"]


def test_the_split_bench_smoke_run_checks_agreement(tmp_path):
    """experiments/split_bench.py on CPU with tf32 emulated: a row per cell, the split path's
    committed state the served one's to float32, its outputs the tf32 verify's but not equal
    to them (no timings off the GPU)."""
    doc = smoke_record(tmp_path, "split_bench.py", "--smoke")
    assert len(doc["rows"]) == 2 and not doc["interrupted"]
    assert all(r["split_vs_served_state"] <= 1e-6 and "split_us" not in r for r in doc["rows"])
    assert all(0 < r["split_vs_tf32_o"] < 1e-2 for r in doc["rows"])


def test_the_tf32_emulation_contract_rows(tmp_path):
    """tf32_emulation.py --contract: a row per decay and implementation; with tf32 emulated
    Eq. 10's commit from the tf32 verify misses the state half, the served and split paths
    meet it."""
    rows = smoke_record(tmp_path, "tf32_emulation.py", "--contract", "--smoke")["rows"]
    state = {(r["decay"], r["impl"]): r["state_rms_single"] for r in rows}
    assert set(state) == {(d, i) for d in ("mild", "strong") for i in ("served", "tf32", "split", "tf32x3")}
    for decay in ("mild", "strong"):
        assert state[decay, "tf32"] > 1e-5 and max(state[decay, i] for i in ("served", "split", "tf32x3")) <= 1e-6


@pytest.mark.parametrize("shape", ["any", "chain"])
@pytest.mark.parametrize("name", ["r-state-first", "r-fold-norm", "r-pairs", "r-quads", "r-passes-4",
                                  "r-row-arg", "r-row-const"])
def test_the_replay_commit_variants_stay_exact(name, shape):
    """The replay variants kept for A/Bs (kernel_variants.py) are rewrites of the
    same arithmetic, not ablations: plain and gated, they commit what the reference does
    (chains: every path node replayed, odd lengths for the pairs and quads, the passes
    kernel's share for the route's)."""
    import torch

    from bole_cli.kernels import tree_commit_replay, tree_commit_replay_gated
    from bole_cli.kernels.reference import gdn_gates_ref, tree_commit_replay_ref
    from test_commit_replay import random_accepted
    from test_kernels import make_case, rel_err

    variants = _kernel_variants()
    sizes = [9, 30, 1] if shape == "any" else [9, 30, 1, 4, 5, 6]  # chains: whole paths of 1 and 4-6 nodes
    case, forest = make_case(21, sizes, h=2, group=2, kdim=16, vdim=24, decay=(-2.0, -0.01), shape=shape)
    accepted = random_accepted(forest.sizes, 21) if shape == "any" else torch.tensor(sizes, dtype=torch.int32) - 1
    gen = torch.Generator().manual_seed(2)
    n, hv = case["g"].shape
    a, b = torch.randn(n, hv, generator=gen), torch.randn(n, hv, generator=gen)
    A_log, dt_bias = torch.rand(hv, generator=gen) - 0.5, torch.randn(hv, generator=gen)
    g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
    common = (case["state_indices"], case["k"], case["v"])
    tree = (case["parents"], case["cu_seqlens"], accepted)
    with variants.kernel_in_place(variants.VARIANTS[name].site, variants.load_variant(name)):
        plain = tree_commit_replay(case["state"].clone(), *common, case["g"], case["beta"], *tree)
        gated = tree_commit_replay_gated(case["state"].clone(), *common, a, b, A_log, dt_bias, *tree)
    assert rel_err(plain, tree_commit_replay_ref(case["state"], *common, case["g"], case["beta"], *tree)) <= 1e-6
    assert rel_err(gated, tree_commit_replay_ref(case["state"], *common, g, beta, *tree)) <= 1e-6


def test_the_deferred_parts_smoke_run_writes_its_record(tmp_path):
    """experiments/deferred_parts.py on CPU: every part of the deferred write's step and the
    served step's beside it run once, untimed."""
    doc = smoke_record(tmp_path, "deferred_parts.py", "--smoke", "--batch", "3", "--nodes", "2")
    assert set(doc["us"]) == {"place", "verify_segments", "gather", "advance", "fold_none", "fold_tenth",
                              "fold_all", "deferred_verify", "served_verify", "served_commit"}
    assert doc["width"] == 16 and doc["device"] == "cpu (smoke)"


def _check_decision():
    module = experiment_module("check_decision")
    return module


def test_check_decision_interrupts_a_late_run_before_killing_it(tmp_path):
    """Past its timeout a `bole bench e2e` gets SIGINT, so it writes what it measured (a
    kill would lose every run): the child here writes a file when interrupted."""
    check = _check_decision()
    marker = tmp_path / "kept"
    child = ("import signal, sys, time\n"
             "def keep(*_):\n"
             f"    open({str(marker)!r}, 'w').write('measured')\n"
             "    sys.exit(130)\n"
             "signal.signal(signal.SIGINT, keep)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    rc = check.run([sys.executable, "-c", child], dict(os.environ), tmp_path / "log", timeout=2)
    assert rc == 124 and marker.read_text() == "measured"
    assert "timed out after 2 s" in (tmp_path / "log").read_text()
    assert check.run([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "log", timeout=30) == 0


def test_check_decision_budgets_stay_within_the_trees():
    check = _check_decision()
    assert check.budgets_around(32, 1, 41) == [16, 32]  # 64 exceeds a 41-node tree
    assert check.budgets_around(64, 4, 41, (0.5, 2.0)) == [32, 64, 128]
    assert check.budgets_around(8, 4, 41, (0.5,)) == [8]  # 4 is one node a request: not a tree


@pytest.mark.parametrize("decoders, chains", [("ar,bole,bole-chain", True), ("ar,chain", True), ("ar,bole", False)])
def test_check_decision_sweeps_chain_depths_only_with_a_chain_decoder(decoders, chains, tmp_path, monkeypatch):
    """bench e2e refuses --chain-depths without a chain decoder: the check passes them only
    where --decoders has one, and its arguments pass the command's own option check."""
    from types import SimpleNamespace

    import typer
    from typer.testing import CliRunner

    from bole_cli import cli
    from bole_cli.commands import bench

    def checked(why):  # the options passed; stop before any GPU work
        raise typer.Exit(42)

    monkeypatch.setattr(bench, "_need_cuda", checked)

    check = _check_decision()
    for vocab in (None, 32768):  # a hot-token head's check runs bench e2e with that head
        args = SimpleNamespace(model="9b", context=4096, decoders=decoders, steps=8, samples=64, out=tmp_path,
                               draft_vocab=vocab)
        argv = check.e2e_args(args, "paper-mbpp", 4, {(6, 4), (3, 2)}, [64, 128], "t")
        assert ("--chain-depths" in argv) == chains
        assert argv[argv.index("--tree-shapes") + 1] == "3x2,6x4" and argv[argv.index("--steps") + 1] == "16"
        assert ("--draft-vocab" in argv) == bool(vocab)
        r = CliRunner().invoke(cli.app, argv)
        assert r.exit_code == 42, r.output


def test_check_decision_reads_the_results_its_own_run_wrote(tmp_path):
    """The e2e run's results: TAG.json, TAG-partial.json (interrupted past its timeout) or
    TAG-failed.json (nothing ran), whichever this run wrote; an earlier check's file in the
    same folder is never read as this run's."""
    import time

    check = _check_decision()
    old = tmp_path / "t.json"
    old.write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time()
    assert check.e2e_results(tmp_path, "t", since) is None
    for end in ("-failed", "-partial", ""):
        (tmp_path / f"t{end}.json").write_text("{}")
        assert check.e2e_results(tmp_path, "t", since) == tmp_path / f"t{end}.json"
        os.utime(tmp_path / f"t{end}.json", (since - 3600, since - 3600))


@pytest.mark.parametrize("n_bytes,address,mode,programs", [(4096 * 4096 * 2, 0, "bulk", None), (65536 + 16, 256, "bulk", 16),
                                                          (65536 + 2, 256, "bulk", 16), (1000, 8, "bulk", None),
                                                          (3 * 128 * 128 + 1, 0, "line", 2), (1, 0, "line", 32),
                                                          (33554432, 0, "line", 16)])
def test_the_l2_prefetch_plan_names_every_byte_once(n_bytes, address, mode, programs):
    """l2_prefetch_bench.launch_plan: lanes of STEP bytes from the start cover the tensor and
    no whole lane lies past it (the kernel clips the last to n_bytes); programs x steps x
    BLOCK lanes hold them all, with at most one step of lanes to spare a program; bulk only
    where the address and the length are multiples of 16, else lines."""
    bench = experiment_module("l2_prefetch_bench")
    bulk, step, grid, steps = bench.launch_plan(n_bytes, address, mode, programs)
    assert bulk == (mode == "bulk" and address % 16 == 0 and n_bytes % 16 == 0)
    assert step == (bench.CHUNK if bulk else bench.LINE)
    lanes = -(-n_bytes // step)
    assert (lanes - 1) * step < n_bytes <= lanes * step
    assert lanes <= grid * steps * bench.BLOCK < lanes + grid * bench.BLOCK
    assert programs is None and steps == 1 or grid <= programs


def test_derive_factors_reproduces_the_codes_factors_from_their_records(tmp_path):
    """experiments/derive_factors.py on its defaults (the records the code's H200 factors
    come from) derives every factor the code holds, each within 2% of it (the code's rounding);
    a record that is not there is refused by its option, exit 2."""
    from bole_cli.calibrate.components import FACTOR_NAMES

    doc = smoke_record(tmp_path, "derive_factors.py")
    assert tuple(doc["factors"]) == FACTOR_NAMES == tuple(doc["code"])
    derive = experiment_module("derive_factors")
    for name in FACTOR_NAMES:
        moved = derive.change(doc["code"][name], doc["factors"][name])
        assert moved != "shape" and float(moved.rstrip("%")) <= 2.0, (name, moved)
    bad = subprocess.run([sys.executable, str(EXPERIMENTS / "derive_factors.py"), "--components", "none.json"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent)))
    assert bad.returncode == 2 and "--components none.json" in bad.stderr


def test_batch_ratio_bound_floors_and_4bs_contradiction():
    """experiments/batch_ratio_bound.py: the weight-read floors it computes are FACTS' (4B 1.97
    ms, 9B 3.72, 27B 12.0 at the H200's copy rate), and at 4B's batch-1 target the copy rate
    alone puts batch 16 / batch 1 above 1.15 (the two decode targets contradict), at 9B's not."""
    bound = experiment_module("batch_ratio_bound").bound
    rows = {n: bound(n) for n in ("4b", "9b", "27b")}
    for name, floor in (("4b", 1.97), ("9b", 3.72), ("27b", 12.0)):
        assert rows[name]["floor_ms"] == pytest.approx(floor, rel=0.01)
    assert rows["4b"]["bound_at_target"] > 1.15 > rows["9b"]["bound_at_target"]
    assert rows["4b"]["min_batch1_for_ratio_ms"] > rows["4b"]["target_ms"]


def test_estimate_against_profiles_covers_each_measured_cell(tmp_path):
    """experiments/estimate_against_profiles.py compares every cell of a measured profile once
    (the H100's), and a GPU without measured profiles is refused by its option, exit 2."""
    out = tmp_path / "h100.json"
    env = dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent))
    run = subprocess.run([sys.executable, str(EXPERIMENTS / "estimate_against_profiles.py"), "--gpu", "h100",
                          "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    import json

    doc = json.loads(out.read_text())
    cells = {(r["model"], r["batch"], r["kv"]) for r in doc["rows"]}
    assert doc["cells"] == len(doc["rows"]) == len(cells) == 27
    assert set(doc["misses"]) == {"t_dec", "tok_s", "mode"}
    bad = subprocess.run([sys.executable, str(EXPERIMENTS / "estimate_against_profiles.py"), "--gpu", "a100"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "--gpu a100: no measured profile" in bad.stderr


def test_attention_rule_judges_the_shipped_rule_on_the_sweeps(tmp_path):
    """experiments/attention_rule.py on the committed launch sweeps (S15-b's 2-8-token cells
    of 9B and 27B, S16-b's 16-48-token trees of 27B, S17-a's 49-64 rows, all H100s; the H200's
    S22-b and S22-c): every cell's rule launch was swept, the shipped rule is nowhere more than
    a bound slower than the S9-f rule it replaced, and within a bound of the fastest launch
    swept that the rule before it misses (S23-a's thresholds: 1.003 on S15-b's, against
    1.0095 before them and 1.005 without a tree's half; 1.009 on S22-c's, against 1.025 and
    1.015; S9-f's 1.144 on S16-b's; undoing either of S17-a's two changes alone gives 1.015 or
    more on its own), so a change that undoes a measured gain fails here; a file that is no
    sweep record is refused by name, exit 2."""
    import json

    results = EXPERIMENTS / "results" / "components"
    env = dict(os.environ, PYTHONPATH=str(EXPERIMENTS.parent))
    # (records, geomean bound against the fastest, worst against S9-f's): the H200's S22-c has
    # one cell 1.08x S9-f's (27B, batch 1, kv 16384, an 8-token tree: the one tile's fewer
    # programs), 1.05x on S15-b's H100 (experiments/NOTES.md "The attention's rule on the H200");
    # S15-b's H100 one 1.07x (9B, batch 16, kv 1024, an 8-token tree: a tree's half threshold,
    # NOTES "The one-tile threshold by form and batch")
    for names, within, worst in (
            (("h100-27b-attention-rows-tile-s15.json", "h100-9b-attention-rows-tile-s15.json"), 1.0045, 1.08),
            (("h100-27b-attention-big-trees-s16.json",), 1.05, 1.06),
            (("h100-27b-attention-rows64-s17.json", "h100-9b-attention-rows64-s17.json"), 1.01, 1.06),
            (("h200-27b-attention-rows-tile-s22.json",), 1.012, 1.09),
            (("h200-27b-attention-rows64-s22.json", "h200-9b-attention-rows64-s22.json"), 1.01, 1.06)):
        out = tmp_path / "judged.json"
        run = subprocess.run([sys.executable, str(EXPERIMENTS / "attention_rule.py"),
                              *(str(results / n) for n in names), "--json", str(out)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        doc = json.loads(out.read_text())
        assert doc["cells"] and not doc["missing"]
        assert doc["range_rule_over_before"][1] <= worst and doc["geomean_rule_over_best"] < within, names
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    run = subprocess.run([sys.executable, str(EXPERIMENTS / "attention_rule.py"), str(bad)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and f"records {bad}" in run.stderr and "Traceback" not in run.stderr


def test_the_whole_step_bench_smoke_run_writes_its_record(tmp_path):
    """experiments/whole_step_bench.py at a tiny model on CPU: a step row per decoder and
    batch (the tree decoders' budget per request, every phase timed), and the drafter's
    levels for the full vocabulary and a hot-token head, one row and top-k rows each; the
    sample phase alone, its kernel walk agreeing with the torch walk."""
    doc = smoke_record(tmp_path, "whole_step_bench.py", "--smoke", timeout=600)
    assert [(r["shape"], r["batch"]) for r in doc["sample_alone"]] == [("3x2", 1), ("3x2", 2)]
    assert all(r["greedy_agrees"] and r["ranked_agrees"] for r in doc["sample_alone"])
    assert [(r["decoder"], r["batch"]) for r in doc["steps"]] == [
        (d, b) for b in (1, 2) for d in ("ar", "bole", "bole-chain")]
    trees = [r for r in doc["steps"] if r["decoder"] == "bole"]
    assert [r["tree_tokens"] for r in trees] == [4, 8]
    assert all(r["wall_ms"] >= r["span_ms"] > 0 and set(r["phase_ms"]) == {"draft", "verify", "sample", "commit"}
               for r in doc["steps"])
    full = doc["draft_levels"][0]["draft_vocab"]
    assert [(r["batch"], r["draft_vocab"], r["rows"]) for r in doc["draft_levels"]] == [
        (b, v, k) for b in (1, 2) for v in (full, 64) for k in (1, 2)]
    assert full > 64


def test_the_memory_fit_run_records_calibrates_own_sweep(tmp_path):
    """memory_fit runs calibrate's sweep (decode, verify points, drafter levels, the sample line)
    and records the estimate's and the runtime's counts beside each point; on the CPU there is
    no device memory to record, so the summary is empty."""
    doc = smoke_record(tmp_path, "memory_fit.py", "--smoke")
    calls = [r["call"] for r in doc["rows"]]
    assert set(calls) == {"decode", "verify", "draft_level", "sample"} and not doc["failures"]
    assert calls.count("decode") == 2 and doc["summary"] == []
    verify = next(r for r in doc["rows"] if r["call"] == "verify")
    assert "draft_head" in verify["estimate"] and verify["runtime_count"]["total"] > 0  # the estimate counts the drafter
    assert len({(r["call"], r["batch"], r["tokens"]) for r in doc["rows"]}) == len(doc["rows"])  # one row a point


def test_the_memory_fit_run_records_a_failing_point_and_lets_the_sweep_list_it():
    """A point that raises (out of memory on the device) is a row with its error and the
    memory held as it failed, and the error goes on to the sweep, which lists it."""
    import types

    import torch

    from bole_cli.calibrate.costmodel import RooflineForward
    from bole_cli.calibrate.sweep import EXACT, run_sweep
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.catalog.models import tiny_spec

    fit = experiment_module("memory_fit")
    spec = tiny_spec(layers=4)

    class Forward:
        timer = types.SimpleNamespace(timed_spec=spec, dtype=torch.float32, path="bole")

        def time_decode(self, b, kv):
            return 1e-3

        def time_verify(self, b, kv, n):
            if n > 4:
                raise RuntimeError("CUDA out of memory (a stand-in)")
            return 2e-3

        def time_sample(self, b, tokens):
            return 1e-5

    rec = fit.Recording(torch, Forward(), RooflineForward(spec, resolve_gpu("h100")), cuda=False)
    result = run_sweep(rec, [1], [16], [2, 4, 8, 16], EXACT)  # no drafter levels (Extras' default)
    assert [(r["call"], r["tokens"], "error" in r) for r in rec.rows] == [
        ("decode", 1, False), ("verify", 2, False), ("verify", 4, False), ("verify", 8, True),
        ("sample", 1, False), ("sample", 4, False)]
    assert "out of memory" in rec.rows[3]["error"] and "N 8: RuntimeError" in result.failures[0]


def test_the_memory_fit_run_reads_the_device_memory_of_each_point_and_its_repeats():
    """With a stand-in torch.cuda (a GPU's counters, kept by hand): each point's row holds the
    peak over all its calls, a repeat's spike included, and not the next point's; the pools
    outside the default one are the private ones; the summary compares peak use with the count."""
    import types

    import torch

    from bole_cli.calibrate.costmodel import RooflineForward
    from bole_cli.calibrate.sweep import Timing, run_sweep
    from bole_cli.catalog.hardware import resolve_gpu
    from bole_cli.catalog.models import tiny_spec

    fit = experiment_module("memory_fit")
    gib = 2**30
    st = {"alloc": 0, "res": 0, "peak_a": 0, "peak_r": 0}

    def spike(n):  # n GiB allocated and freed again: only the peaks remember it
        st["res"] = max(st["res"], n * gib)
        st["peak_a"], st["peak_r"] = max(st["peak_a"], n * gib), max(st["peak_r"], st["res"])

    cuda = types.SimpleNamespace(
        mem_get_info=lambda: (100 * gib - st["res"] - gib, 100 * gib),  # 1 GiB outside torch
        memory_reserved=lambda: st["res"], memory_allocated=lambda: st["alloc"],
        max_memory_allocated=lambda: st["peak_a"], max_memory_reserved=lambda: st["peak_r"],
        memory_snapshot=lambda: [{"segment_pool_id": (0, 1), "total_size": 3 * gib, "allocated_size": 2 * gib},
                                 {"segment_pool_id": (0, 0), "total_size": 7 * gib, "allocated_size": gib}],
        reset_peak_memory_stats=lambda: st.update(peak_a=st["alloc"], peak_r=st["res"]))
    spec = tiny_spec(layers=4)
    calls = []

    class Forward:
        timer = types.SimpleNamespace(timed_spec=spec, dtype=torch.float32, path="bole")

        def time_decode(self, b, kv):
            return 1e-3

        def time_verify(self, b, kv, n):
            calls.append(n)
            if n == 4 and calls.count(4) == 3:  # the last timed call of N 4
                spike(40)
            return 2e-3

        def time_sample(self, b, tokens):
            return 1e-5

    rec = fit.Recording(types.SimpleNamespace(cuda=cuda), Forward(), RooflineForward(spec, resolve_gpu("h100")),
                        cuda=True)
    run_sweep(rec, [1], [16], [2, 4, 8], Timing(warmup=1, repeats=2, max_rounds=1))
    peaks = {(r["call"], r["tokens"]): r["memory"]["peak_reserved"] // gib for r in rec.rows}
    assert peaks[("verify", 4)] == 40 and peaks[("verify", 8)] == 40 and peaks[("verify", 2)] == 0
    row = rec.rows[0]["memory"]
    assert row["private_reserved"] == 3 * gib and row["private_allocated"] == 2 * gib
    assert row["outside_torch"] == gib
    (v4,) = [s for s in fit.summary(rec.rows) if s["tokens"] == 4]
    assert v4["peak_in_use_gib"] == 41 and v4["over_estimate_gib"] == 41 - v4["estimate_gib"]
