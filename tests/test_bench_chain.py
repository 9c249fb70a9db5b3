"""Issue 15: chains as the baseline. The ReplaySSM and Bole chain decoders of `bole bench
e2e` (exactness against autoregressive decoding, acceptance as the rank-1 path of the tree's
matrix), the greedy exactness verdict and its exit code, the tree-vs-chain comparison, the
kernel bench's ReplaySSM cells (agreement check, equal-time view), and issue 18's bench
bullets (--tag checked before any work, a smoke run of seconds that claims no search)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.bench import kernel_report
from bole_cli.bench.e2e import harness, options, report, sweep, verdicts
from bole_cli.bench.kernel_bench import KernelBenchResult, KernelCase, check_agreement
from bole_cli.runtime import tiny_spec
from bole_cli.trees.generators import beam_tree_size
from test_bench_e2e import oracle, streams  # the oracle drafter and the stream helper

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

DEPTH, TOPK = 3, 2
# SGLang's ReplaySSM ring kernel tiles the key dim in halves fed to tl.dot (>= 16 each)
RING_SPEC = dict(layers=4, gdn_key_dim=32)


def _text(tables, width=80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    for t in tables:
        console.print(t)
    return console.export_text()


# ---- the chain decoders ------------------------------------------------------------------------

def ring_oracle(seed: int):
    """`oracle`, reading the ReplaySSM decoder's committed state as checkpoint + ring (the
    pool alone lags the ring between materialisations)."""
    inner = oracle(seed)

    def override(dec, toks):
        if dec.path != "replayssm":
            return inner(dec, toks)
        live = dec.cache
        dec.cache = live.clone()
        dec.cache.gdn_state.copy_(dec.model.replayssm.committed_state(live.gdn_state))
        try:
            return inner(dec, toks)
        finally:
            dec.cache = live

    return override


def test_chain_decoders_emit_the_autoregressive_stream(sglang_source):
    """SGLang's ReplaySSM ring (interpreted on CPU) and Bole on the same chains commit exactly
    the tokens autoregressive decoding emits, with deep accepted prefixes (oracle drafter),
    over enough steps that the ring keeps history between materialisations."""
    bench = harness.E2EBench(tiny_spec(**RING_SPEC), device="cpu", dtype=torch.float32, context=6, depth=DEPTH,
                             topk=TOPK, acceptance="greedy", budget=14, seed=0, warmup=1, steps=2)
    bench.use_replayssm()
    bench.chain_depth = DEPTH
    engine, seen = bench.model.replayssm, []
    verify_layer = engine.verify_layer

    def spy(rings, layer, *args):
        seen.append(int(rings["write_pos"].max()))
        return verify_layer(rings, layer, *args)

    engine.verify_layer = spy
    rssm, acc_r = streams(bench, "chain", 2, 6, ring_oracle(1))
    engine.verify_layer = verify_layer
    assert max(seen) > 0  # some steps verified over committed ring history
    bole, acc_b = streams(bench, "bole-chain", 2, 6, ring_oracle(1))
    assert rssm == bole and acc_r == acc_b
    ar, _ = streams(bench, "ar", 2, max(map(len, rssm)))
    for b in range(2):
        assert rssm[b] == ar[b][: len(rssm[b])], f"request {b}"
    assert max(max(a) for a in acc_r) >= 3  # prefixes of 2+ drafts were folded


@pytest.mark.gpu_slow
def test_chain_decoders_on_cuda_with_graphs(sglang_source):
    """The same exactness check on the GPU, each phase replayed as a CUDA graph (the ring's
    cursors and history, Bole's commit and the committed lengths all advance on the device)."""
    bench = harness.E2EBench(tiny_spec(**RING_SPEC), device="cuda", dtype=torch.float32, context=6, depth=DEPTH,
                             topk=TOPK, acceptance="greedy", budget=14, seed=0, warmup=1, steps=2)
    assert bench.use_graphs
    bench.use_replayssm()
    bench.chain_depth = DEPTH
    rssm, acc_r = streams(bench, "chain", 2, 6, ring_oracle(1))
    bole, acc_b = streams(bench, "bole-chain", 2, 6, ring_oracle(1))
    assert rssm == bole and acc_r == acc_b
    ar, _ = streams(bench, "ar", 2, max(map(len, rssm)))
    for b in range(2):
        assert rssm[b] == ar[b][: len(rssm[b])], f"request {b}"
    assert max(max(a) for a in acc_r) >= 3


def test_chain_acceptance_is_the_rank1_prefix_of_the_tree():
    """Same draws: a depth-d chain accepts exactly the rank-0 prefix of the tree's walk, so
    it never commits more than the tree (all nodes kept), and its expectation is the
    rank-1 path's."""
    bench = harness.E2EBench(tiny_spec(layers=4), device="cpu", dtype=torch.float32, context=8, depth=DEPTH,
                             topk=TOPK, acceptance="paper-mbpp", budget=2 * 15, seed=3, warmup=1, steps=4)
    tree = bench.run("bole", 2)
    bench.chain_depth = DEPTH
    chain = bench.run("bole-chain", 2)
    assert not tree.error and not chain.error
    pairs = [(c, t) for cs, ts in zip(chain.accept_trace, tree.accept_trace) for c, t in zip(cs, ts)]
    assert all(c <= t for c, t in pairs)
    assert any(c < t for c, t in pairs)  # seed 3: the tree's other ranks do accept more
    q = bench.q
    want = 1 + sum(math.prod(q[d][0] for d in range(n)) for n in range(1, DEPTH + 1))
    assert chain.expected_accepted == pytest.approx(want)
    assert tree.expected_accepted > chain.expected_accepted


def _result(decoder, batch, streams, depth=None, tok_s=1.0):
    return harness.RunResult(decoder, batch, tok_s=tok_s, streams=streams, chain_depth=depth)


def test_exactness_verdict():
    same = [_result("ar", 1, [[5, 6, 7]]), _result("chain", 1, [[5, 6]], 2), _result("bole", 1, [[5, 6, 7, 8]])]
    assert verdicts.exactness(same) == {"identical": True, "compared_runs": 2, "mismatches": [], "failed": []}
    bad = same + [_result("bole-chain", 1, [[5, 9]], 1)]
    got = verdicts.exactness(bad)
    assert not got["identical"] and got["mismatches"] == ["batch 1, request 0: bole-chain d=1 differs from ar at token 1"]
    failed = same + [harness.RunResult("chain", 1, error="boom")]
    assert not verdicts.exactness(failed)["identical"]


def test_greedy_mismatch_exits_1_and_keeps_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(verdicts, "exactness", lambda results: {
        "identical": False, "compared_runs": 2, "mismatches": ["batch 1, request 0: bole differs"], "failed": []})
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--batch", "1", "--acceptance",
                                "greedy", "--out-dir", str(tmp_path)])
    assert r.exit_code == 1 and "greedy exactness failed" in r.stderr
    assert "greedy exactness: FAILED - batch 1, request 0: bole differs" in r.stdout
    assert json.loads((tmp_path / "e2e-cpu-tiny.json").read_text())["greedy_exact"]["identical"] is False


def test_greedy_run_states_its_result(tmp_path):
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--batch", "1", "--acceptance",
                                "greedy", "--out-dir", str(tmp_path)])
    assert r.exit_code == 0, r.stderr
    assert "greedy exactness: PASSED - every decoder emitted the same token stream (2 runs" in r.stdout


# ---- issue 18: the bench commands' bullets -------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["bench", "e2e", "--device", "cpu", "--tiny", "--tag", "a/b"],
    ["bench", "e2e", "--device", "cpu", "--tiny", "--tag", ".."],
    ["bench", "kernels", "--tag", "../escape"],
    ["bench", "kernels", "--precision", "fast"],
])
def test_bad_tag_fails_before_any_work(argv, monkeypatch):
    monkeypatch.setattr(sweep, "run_e2e", lambda *a, **k: pytest.fail("the benchmark ran"))
    t0 = time.monotonic()
    r = runner.invoke(cli.app, argv)
    flag = argv[-2]
    assert r.exit_code == 2 and flag in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 5


def test_default_smoke_run_takes_seconds_and_claims_no_search(tmp_path):
    t0 = time.monotonic()
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--out-dir", str(tmp_path)])
    took = time.monotonic() - t0
    assert r.exit_code == 0, r.stderr
    assert took < 90, took  # ~3 s alone on 2 cores (it was 4 minutes); slack for shared cores
    assert "binary search" not in r.stdout and "largest-batch search skipped: needs CUDA" in r.stdout
    data = json.loads((tmp_path / "e2e-cpu-tiny.json").read_text())
    assert data["max_batch"] == {} and data["max_batch_skipped"].startswith("skipped")
    assert data["context"] == 16 and data["steps"] == 2 and {r["batch"] for r in data["results"]} == {1, 2}


# ---- the e2e comparison --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chain_run(sglang_source):
    """A CPU run of all five decoders (ReplaySSM interpreted) on a 4-layer model, its document
    (skipped without SGLang's source: the sglang_source fixture)."""
    cfg = options.E2EConfig(spec=tiny_spec(**RING_SPEC), batches=[1, 2], context=8, depth=DEPTH, topk=TOPK,
                            steps=1, warmup=0, device="cpu", dtype="float32", chain_depths=(1, 2),
                            decoders=("ar", "snapshot", "bole", "chain", "bole-chain"), budget="profile")
    return sweep.run_e2e(cfg)


def test_comparison_rows_and_ceiling(chain_run):
    rows = chain_run["comparison"]
    assert [row["batch"] for row in rows] == [1, 2]
    for row in rows:
        assert set(row["best"]) == {"ar", "snapshot", "bole", "chain", "bole-chain"}
        runs = [r for r in chain_run["results"] if r["batch"] == row["batch"] and r["decoder"] == "chain"]
        assert [r["chain_depth"] for r in runs] == [1, 2]
        assert row["best"]["chain"]["tok_s"] == max(r["tok_s"] for r in runs)
        bole = max(row["best"]["bole"]["tok_s"], row["best"]["bole-chain"]["tok_s"])
        assert row["bole_over_replayssm"] == pytest.approx(bole / row["best"]["chain"]["tok_s"])
        assert row["ceiling"] > 1.0 and row["winner"] in row["best"]
    assert "ReplaySSM" in chain_run["replayssm"] and chain_run["chain_depths"] == [1, 2]


def test_e2e_tables_with_chains_fit_80_columns(chain_run):
    text = _text([report.comparison_table(chain_run)])  # CPU times are too long for the others
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "tree vs chain, end to end" in text and " d1 " in text or " d2 " in text
    assert "ReplaySSM chain d2" in _text(report.tables(chain_run, 200), 200)
    lines = report.notes(chain_run)
    assert any(line.startswith("batch 1: Bole's best over the best ReplaySSM chain") for line in lines)
    assert not any("budget at batch 1: chain" in line for line in lines)


# ---- the kernel bench's ReplaySSM cells ---------------------------------------------------------

def _chain_case(batch, nodes, bole_us, rssm_us, **kw):
    return KernelCase(batch, nodes, "chain", sglang_us=3 * rssm_us, bole_us=bole_us, bole_verify_us=bole_us / 2,
                      bole_commit_us=bole_us / 2, floor_us=1.0, replayssm_us=rssm_us,
                      replayssm_verify_us=rssm_us * 0.7, replayssm_commit_us=rssm_us * 0.3,
                      fold_us=kw.get("fold", 1.5 * rssm_us), fold_diff_o=1e-3, fold_diff_state=1e-6,
                      replayssm_diff_o=kw.get("o", 1e-3), replayssm_diff_state=kw.get("state", 1e-6),
                      max_rel_diff_o=1e-3, max_rel_diff_state=1e-6, deferred_us=kw.get("deferred"),
                      deferred_diff_o=1e-7 if kw.get("deferred") else None,
                      deferred_diff_state=kw.get("deferred_state", 0.0) if kw.get("deferred") else None)


def test_agreement_check_fails_loudly():
    assert check_agreement(_chain_case(1, 8, 5.0, 6.0), "float32") == []
    bad = check_agreement(_chain_case(4, 16, 5.0, 6.0, state=0.5, o=float("nan")), "float32")
    assert bad == ["chain batch 4 x 16: ReplaySSM o differs from Bole's by nan (tolerance 3e-02)",
                   "chain batch 4 x 16: ReplaySSM state differs from Bole's by 5.00e-01 (tolerance 5e-03)"]
    assert check_agreement(_chain_case(1, 8, 5.0, 6.0, state=1e-2), "bfloat16") == []
    assert check_agreement(_chain_case(1, 8, 5.0, 6.0, state=4e-3), "float32") == []  # TF32 room, ring only
    assert check_agreement(_chain_case(1, 8, 5.0, 6.0, deferred=4.0, deferred_state=9e-4), "float32") == []
    assert check_agreement(_chain_case(2, 4, 5.0, 6.0, deferred=4.0, deferred_state=2e-3), "float32") == [
        "chain batch 2 x 4: deferred state differs from Bole's by 2.00e-03 (tolerance 1e-03)"]
    fold = _chain_case(2, 8, 5.0, 6.0)
    fold.fold_diff_state = 4e-3
    assert check_agreement(fold, "float32") == [
        "chain batch 2 x 8: KDA fold state differs from Bole's by 4.00e-03 (tolerance 1e-03)"]


def test_replayssm_table_equal_time_view_and_notes():
    trees = [KernelCase(1, n, "random", bole_us=us, bole_verify_us=us, bole_commit_us=0.1, floor_us=1.0)
             for n, us in ((8, 4.0), (16, 5.5), (32, 7.0), (64, 20.0))]
    trees.append(KernelCase(4, 8, "random", bole_us=10.0, bole_verify_us=9.0, bole_commit_us=1.0, floor_us=1.0))
    chains = [_chain_case(1, 8, 5.0, 7.5, deferred=6.0), _chain_case(1, 64, 30.0, 25.0),
              _chain_case(4, 8, 9.0, 3.0, deferred=3.3), _chain_case(16, 8, 9.0, 3.0, deferred=1234.5)]
    # batch 16: no random trees, no row; chains of 64: no deferred write (past one tile)
    result = KernelBenchResult("H200", {}, "m", 4e12, cases=trees + chains)
    view = kernel_report.equal_time_view(result.cases)
    assert view == [
        {"batch": 1, "replayssm_chain_nodes": 8, "replayssm_us": 7.5, "bole_chain_us": 5.0,
         "largest_tree_nodes": 32, "tree_us": 7.0},
        {"batch": 4, "replayssm_chain_nodes": 8, "replayssm_us": 3.0, "bole_chain_us": 9.0,
         "largest_tree_nodes": None, "tree_us": None}]
    data = kernel_report.kernel_document(result, dtype="bfloat16", state_dtype="float32", command="", seconds=0)
    assert data["summary"]["bole_over_replayssm_max"] == pytest.approx(3.0) and data["summary"]["agree"]
    lines = kernel_report.notes(result, data)
    assert "chains, Bole / ReplaySSM ring time: worst 3.00" in lines[0] and "SLOWER" in lines[0]
    assert lines[1] == ("chains, Bole's deferred write / ReplaySSM ring time: worst 411.50, geometric mean "
                        "7.13 (SLOWER at some cells)")
    assert data["summary"]["deferred_over_replayssm_max"] == pytest.approx(411.5)
    assert "Bole's largest tree within it: 32 nodes (7.0 us)" in lines[2]
    assert "no measured Bole tree fits" in lines[3]
    text = _text(kernel_report.tables(result, 80))
    assert "…" not in text and "ReplaySSM ring (GDN's protocol)" in text and "1.20" in text
    assert "deferred write vs the ReplaySSM ring" in text and " 1234.5 " in text and " 411.50 " in text
    assert data["summary"]["replayssm_protocol"] == "circular ring (GDN)"
    assert data["summary"]["bole_over_kda_fold_geomean"] is not None
    assert max(len(line) for line in text.splitlines()) <= 80


def test_measured_replayssm_cells_agree_and_fit_80_columns():
    """The shipped H200 run I15-b (experiments/results/issue15/, measured with the FOLD
    protocol, KDA's, before the bench moved to the ring GDN models run): every cell agrees
    with Bole, and its tables fit 80 columns whole."""
    from pathlib import Path

    data = json.loads((Path(__file__).parent.parent / "experiments/results/issue15/kernels-replayssm-f32-mini.json")
                      .read_text())
    fields = set(KernelCase.__dataclass_fields__)
    result = KernelBenchResult(data["device"], data["versions"], data["model"], data["copy_bandwidth_tb_s"] * 1e12,
                               cases=[KernelCase(**{k: v for k, v in c.items() if k in fields})
                                      for c in data["cases"]])
    assert data["disagreements"] == [] and all(check_agreement(c, "float32") == [] for c in result.cases)
    assert all(c.replayssm_us and c.bole_over_replayssm < 1 for c in result.cases)
    text = _text(kernel_report.tables(result, 80))
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert kernel_report.equal_time_view(result.cases) == []  # no random trees in that run


def test_tree_budget_sweep_reports_the_best_budget():
    """--tree-budgets: the tree runs at each budget (once where two keep the same nodes); the
    comparison takes its fastest run, and the ceiling that run's expected tokens over the
    chain's at the same depth."""
    cfg = options.E2EConfig(spec=tiny_spec(layers=4), batches=[2], context=8, depth=DEPTH, topk=TOPK, steps=1,
                            warmup=0, device="cpu", dtype="float32", chain_depths=(DEPTH,),
                            decoders=("ar", "snapshot", "bole", "bole-chain"), tree_budgets=(4, 12, 500, 900))
    said: list[str] = []
    data = sweep.run_e2e(cfg, said.append)
    trees = [r for r in data["results"] if r["decoder"] == "bole"]
    every = 2 * beam_tree_size(DEPTH, TOPK)  # both budgets past it keep every node: one run
    assert [r["budget"] for r in trees] == [4, 12, every] and data["tree_budgets"] == [4, 12, 500, 900]
    assert sum("not run again" in line for line in said) == 2  # snapshot's and Bole's
    assert data["same_acceptance_snapshot_vs_bole"] == {"2": True}  # their runs still pair up
    fastest = max(trees, key=lambda r: r["tok_s"])
    row = data["comparison"][0]
    assert row["best"]["bole"]["budget"] == fastest["budget"]
    assert row["best"]["bole"]["expected"] == fastest["expected_accepted"]
    assert trees[1]["expected_accepted"] > trees[0]["expected_accepted"]  # a larger budget keeps more nodes
    assert "ceiling" not in row  # no ReplaySSM chain in this run: no gain over it either
    # each budget is named by the option that gave it, every one of them in the summary
    assert trees[0]["budget_source"] == "--tree-budgets 4"
    from bole_cli.bench.e2e.report import notes

    line = next(x for x in notes(data) if x.startswith("budgets at batch 2: "))
    assert line.startswith("budgets at batch 2: --tree-budgets 4; --tree-budgets 12; --tree-budgets 500; ")


def test_greedy_exactness_needs_two_decoders_and_says_so_at_once():
    t0 = time.perf_counter()
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--acceptance", "greedy",
                                "--decoders", "ar"])
    assert r.exit_code == 2 and "at least two --decoders" in r.stderr
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("sub", ["kernels", "e2e"])
def test_out_dir_is_checked_before_any_work(sub):
    extra = ["--device", "cpu", "--tiny"] if sub == "e2e" else []
    t0 = time.perf_counter()
    r = runner.invoke(cli.app, ["bench", sub, "--out-dir", "/proc/nope", *extra])
    assert r.exit_code == 2 and "--out-dir" in r.stderr and "/proc/nope" in r.stderr
    assert time.perf_counter() - t0 < 5
