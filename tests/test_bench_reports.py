"""The library behind `bole bench`'s output: the kernel bench's document, tables, notes and
plot (bench/kernel_report.py), the e2e report (bench/e2e/report.py) read from the shipped
results files, the result file names (bench/results.py), the decoder registry
(bench/e2e/decoders.py) and the one CUDA-graph cache (runtime/graphs.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from rich.console import Console

from bole_cli.bench import kernel_report
from bole_cli.bench.e2e import decoders, report
from bole_cli.bench.kernel_bench import CommitCase, KernelBenchResult, KernelCase
from bole_cli.bench.results import result_stem, write_results
from bole_cli.errors import InputError

RESULTS = Path(__file__).parent.parent / "experiments/results"


def _text(tables, width: int) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    for t in tables:
        console.print(t)
    return console.export_text()


@pytest.fixture(scope="module")
def kernel_result() -> KernelBenchResult:
    data = json.loads((RESULTS / "kernels-h200-qwen3.5-9b.json").read_text())
    fields = set(KernelCase.__dataclass_fields__)
    return KernelBenchResult(device=data["device"], versions=data["versions"], model=data["model"],
                             copy_bandwidth=data["copy_bandwidth_tb_s"] * 1e12,
                             cases=[KernelCase(**{k: v for k, v in c.items() if k in fields}) for c in data["cases"]],
                             commits=[CommitCase(**c) for c in data["commits"]], notes=data["notes"])


@pytest.fixture(scope="module")
def e2e_data() -> dict:
    return json.loads((RESULTS / "e2e-h200-qwen3.5-9b.json").read_text())


# ---- the kernel bench --------------------------------------------------------------------------

def test_kernel_document_reproduces_the_shipped_summary(kernel_result):
    shipped = json.loads((RESULTS / "kernels-h200-qwen3.5-9b.json").read_text())
    data = kernel_report.kernel_document(kernel_result, dtype="bfloat16", state_dtype="float32",
                                         command="bole bench kernels", seconds=1.5)
    s = data["summary"]
    assert s[kernel_report.GEOMEAN_KEY] == pytest.approx(shipped["summary"][kernel_report.GEOMEAN_KEY])
    assert (s["command"], s["seconds"], s["dtype"], s["state_dtype"]) == ("bole bench kernels", 1.5, "bfloat16",
                                                                          "float32")
    assert len(data["cases"]) == len(kernel_result.cases) and data["model"] == kernel_result.model


def test_kernel_cells_and_notes(kernel_result):
    c = next(c for c in kernel_result.cases if (c.tree, c.batch, c.nodes) == ("random", 16, 64))
    cells = kernel_report.kernel_cells(c)
    assert set(cells) == set(kernel_report.KERNEL_TIMES + kernel_report.KERNEL_BYTES)
    assert cells["SGLang us"] == f"{c.sglang_us:.1f}" and cells["speedup"] == f"{c.speedup:.1f}x"
    assert (cells["snapshots"], cells["factors"]) == ("2.00 GiB", "24.1 MiB")
    bole_only = KernelCase(batch=1, nodes=8, tree="chain", bole_us=2.0, bole_verify_us=1.5, bole_commit_us=0.5,
                           floor_us=1.0)
    cells = kernel_report.kernel_cells(bole_only)
    assert (cells["SGLang us"], cells["speedup"], cells["o diff"], cells["% floor"]) == ("-", "-", "-", "50%")
    data = kernel_report.kernel_document(kernel_result, dtype="bfloat16", state_dtype="float32", command="",
                                         seconds=0.0)
    lines = kernel_report.notes(kernel_result, data)
    assert lines[0].startswith("commit of all 24 GDN layers at batch 16: Bole 458 us in one launch")
    assert lines[0].endswith("(1.50 GiB), SGLang copy-back 410 us")
    assert lines[-1] == "geometric-mean speedup (random trees, batch 1/4/16 x nodes 16/32/64): 4.8x"
    alone = KernelBenchResult("cpu", {}, "m", 1e12, cases=[bole_only])
    assert kernel_report.notes(alone, kernel_report.kernel_document(alone, dtype="", state_dtype="", command="",
                                                                    seconds=0.0)) == []


def test_kernel_tables_one_wide_or_two_narrow(kernel_result):
    assert len(kernel_report.tables(kernel_result, kernel_report.WIDE_COLUMNS)) == 1
    narrow = kernel_report.tables(kernel_result, kernel_report.WIDE_COLUMNS - 1)
    assert len(narrow) == 2
    text = _text(narrow, 80)
    assert "…" not in text and "One GDN layer, Qwen/Qwen3.5-9B shape" in text


def test_kernel_plot_writes_a_png(kernel_result, tmp_path):
    kernel_report.plot(kernel_result, tmp_path / "k.png")
    assert (tmp_path / "k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the e2e report ---------------------------------------------------------------------------

def test_e2e_notes(e2e_data):
    lines = report.notes(e2e_data)
    assert lines[0] == f"snapshot tree verify: {e2e_data['snapshot_engine']['description']}"
    assert any(line.startswith("budget at batch 16: ") for line in lines)
    assert any(line.startswith("max batch: binary search up to 256") for line in lines)
    assert not any("WARNING" in line or "failed" in line for line in lines)
    broken = copy.deepcopy(e2e_data)
    broken["same_acceptance_snapshot_vs_bole"]["4"] = False
    broken["results"][0]["error"] = "out of memory"
    broken["max_batch"]["bole"]["error"] = "RuntimeError: boom"
    lines = report.notes(broken)
    assert "WARNING: the two tree decoders accepted different nodes at batch 4" in lines
    assert "autoregressive at batch 1 failed: out of memory" in lines
    assert "largest-batch search of Bole stopped: RuntimeError: boom" in lines


def test_e2e_tables_mark_failures_and_max_batch(e2e_data):
    data = copy.deepcopy(e2e_data)
    data["results"][0]["error"] = "out of memory"
    data["results"][1]["error"] = "ValueError: x"
    data["max_batch"]["ar"] = {"max_batch": 12, "capped": False, "exact": False, "fails_at": 16}
    text = _text(report.tables(data, 200), 200)
    assert "OOM" in text and "error" in text and "12 (< 16)" in text and ">= 256" in text
    assert "32 (< 48)" in text  # the snapshot decoder's bracket, from the file


def test_e2e_plot_writes_a_png(e2e_data, tmp_path):
    report.plot(e2e_data, tmp_path / "e.png")
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- file names, the decoder registry ------------------------------------------------------------

def test_result_stem_and_files(tmp_path):
    assert result_stem(None, "kernels", "NVIDIA H200", "Qwen/Qwen3.5-9B") == "kernels-h200-qwen3.5-9b"
    assert result_stem(None, "e2e", "cpu", "tiny") == "e2e-cpu-tiny"
    assert result_stem("mine", "e2e", "cpu", "tiny") == "mine"
    for bad in ("", "a/b", "a\\b", ".", ".."):
        with pytest.raises(InputError, match="--tag"):
            result_stem(bad, "e2e", "cpu", "tiny")
    path = write_results({"b": 1, "a": [1, 2]}, lambda p: p.write_bytes(b"png"), tmp_path, "run")
    assert path == tmp_path / "run.json" and json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert (tmp_path / "run.png").read_bytes() == b"png"


def test_decoder_registry():
    # the two chain decoders came after the original three (the earlier names unchanged)
    names = ("ar", "snapshot", "bole", "chain", "bole-chain")
    assert decoders.DECODERS == names
    assert decoders.LABELS == {"ar": "autoregressive", "snapshot": "snapshot tree", "bole": "Bole",
                               "chain": "ReplaySSM chain", "bole-chain": "Bole chain"}
    assert decoders.SHORT_LABELS == {"ar": "AR", "snapshot": "snapshot", "bole": "Bole", "chain": "RSSM",
                                     "bole-chain": "Bole ch"}
    assert [decoders.decoder_class(n).drafts for n in names] == [False] + [True] * 4
    assert [decoders.decoder_class(n).chain for n in names] == [False, False, False, True, True]
    assert [decoders.decoder_class(n).path for n in names[1:]] == ["snapshot", "bole", "replayssm", "bole"]
    assert decoders.BOLE_DECODERS == ("bole", "bole-chain")
    with pytest.raises(InputError, match="expected one of ar, snapshot, bole, chain, bole-chain"):
        decoders.decoder_class("chains")


def test_options_know_the_registry_names():
    """--decoders is checked without torch against options' copy of the registry's names."""
    from bole_cli.bench.e2e import options

    assert options.DECODER_NAMES == decoders.DECODERS
    classes = decoders.DECODER_CLASSES
    assert options.CHAIN_DECODERS == tuple(n for n, c in classes.items() if c.chain)
    assert options.TREE_DECODERS == tuple(n for n, c in classes.items() if c.verifies_tree())


# ---- the one CUDA-graph cache ---------------------------------------------------------------------

def test_graph_cache_off_runs_eagerly():
    from bole_cli.runtime.graphs import GraphCache

    cache = GraphCache(False, reason="no CUDA here")
    assert not cache.enabled and cache.reason == "no CUDA here"
    assert cache.run(("k",), lambda: 6) == 6


def test_graph_cache_runs_once_eagerly_then_captures_once_per_key_and_replays(monkeypatch):
    """Capture is faked (no CUDA): the cache's own logic, per key. Every call executes the
    step exactly once (eager first, then capture without warm-up, then replays), and a
    failed capture falls back to eager."""
    from bole_cli.runtime import graphs

    captured, calls = [], []

    class FakeStep:
        def __init__(self, fn):
            self.fn, self.output = fn, None  # a capture records; it executes nothing

        def replay(self):
            self.output = self.fn()
            return self.output

    def fake_capture(fn, *, warmup, pool):
        captured.append(warmup)
        return FakeStep(fn), ""

    def step():
        calls.append(1)
        return len(calls)

    monkeypatch.setattr(graphs.torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(graphs, "try_capture", fake_capture)
    cache = graphs.GraphCache(True)
    assert cache.run(("decode",), step) == 1 and captured == []  # eager: the first step itself
    assert cache.run(("decode",), step) == 2 and captured == [0]  # captured, no warm-up, replayed
    assert cache.run(("decode",), step) == 3 and captured == [0]  # replayed, not recaptured
    assert cache.run(("verify",), lambda: "v") == "v" and captured == [0]
    cache.run(("verify",), lambda: "v")
    assert captured == [0, 0]
    cache.clear()
    cache.run(("verify",), lambda: "v")
    assert captured == [0, 0]  # eager again after a clear

    monkeypatch.setattr(graphs, "try_capture", lambda fn, **kw: (None, "RuntimeError: sync in capture"))
    assert cache.run(("new",), lambda: 2) == 2
    assert cache.run(("new",), lambda: 3) == 3
    assert not cache.enabled and cache.reason == "RuntimeError: sync in capture"


@pytest.mark.parametrize("cells", [3, 0], ids=["some-cells", "before-the-first"])
def test_interrupted_kernel_bench_writes_what_it_measured(cells, kernel_result, tmp_path, monkeypatch):
    """Ctrl-C during `bole bench kernels`: the cells measured before it are written (marked
    interrupted; no picture of none) and the command ends with 130, as every interrupted
    command does."""
    import torch
    from typer.testing import CliRunner

    from bole_cli import cli
    from bole_cli.bench import kernel_bench

    partial = copy.deepcopy(kernel_result)
    partial.cases, partial.commits, partial.interrupted = partial.cases[:cells], [], True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from bole_cli.catalog import hardware
    monkeypatch.setattr(hardware, "cuda_driver_missing", lambda: False)
    calls = []
    monkeypatch.setattr(kernel_bench, "run_kernel_bench", lambda *a, **k: calls.append(k) or partial)
    r = CliRunner().invoke(cli.app, ["bench", "kernels", "--no-sglang", "--out-dir", str(tmp_path), "--tag", "cut",
                                     "--precision", "tf32x3"])
    assert r.exit_code == 130, r.output
    data = json.loads((tmp_path / "cut-partial.json").read_text())
    assert data["interrupted"] is True and len(data["cases"]) == cells
    # the precision reaches the bench and its record (the plug-in's default, timed as served)
    assert calls[0]["precision"] == "tf32x3" and data["summary"]["precision"] == "tf32x3"
    assert (tmp_path / "cut-partial.png").exists() == (cells > 0) == ("cut-partial.png" in r.output)


def test_per_step_milliseconds_keep_about_four_figures():
    """A slow run's phases (the snapshot verify on CPU: 1353.69 ms) fit the narrow table's
    columns: four figures, not a cut '1353.…'."""
    from bole_cli.bench.e2e.report import _ms

    assert [_ms(x) for x in (0.004, 7.416, 99.994, 135.36, 1353.69, 26925.0)] == [
        "0.00", "7.42", "99.99", "135.4", "1354", "26925"]
