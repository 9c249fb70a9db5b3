"""bole_cli.timing: the GPU timing helpers shared by `bole bench kernels`, `bole tune-kernels`
and the calibration timer. CPU parts here; the CUDA-graph parts run on a GPU only."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from bole_cli import timing


def test_importing_timing_and_the_tuner_is_light():
    code = ("import json, sys, bole_cli.timing, bole_cli.tuning, bole_cli.tuning.run, bole_cli.tuning.gpu, "
            "bole_cli.tuning.study, bole_cli.tuning.report; "
            "print(json.dumps([m for m in ('torch', 'triton', 'optuna') if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == []


def test_seconds_per_call_on_the_cpu_runs_the_step_calls_times():
    calls = []
    s = timing.seconds_per_call(None, lambda: calls.append(1), 5, cuda=False)
    assert len(calls) == 5 and s >= 0.0


def test_tree_parents_shapes():
    chain = timing.tree_parents("chain", 6, random.Random(0))
    assert chain == [-1, 0, 1, 2, 3, 4]
    tree = timing.tree_parents("random", 40, random.Random(1))
    assert len(tree) == 40 and tree[0] == -1 and tree.count(-1) == 1
    assert all(0 <= p < i for i, p in enumerate(tree) if i)


def test_conv_inputs_on_the_cpu():
    import torch

    a = timing.ConvInputs(torch, 64, 4, 3, 8, seed=5, act_dtype=torch.float32, device="cpu")
    b = timing.ConvInputs(torch, 64, 4, 3, 8, seed=5, act_dtype=torch.float32, device="cpu")
    assert a.x.shape == (24, 64) and a.conv_state.shape == (4, 64, 3) and a.weight.shape == (64, 4)
    assert a.cu.tolist() == [0, 8, 16, 24] and a.slots.shape == (3,) and a.accepted.shape == (3,)
    assert torch.equal(a.x, b.x) and torch.equal(a.parents, b.parents)  # seeded


@pytest.mark.gpu
def test_layer_inputs_and_graph_timing_on_a_gpu():
    import torch

    from bole_cli import kernels
    from bole_cli.catalog.models import resolve_model

    spec = resolve_model("9b")
    full = timing.LayerInputs(torch, spec, 2, 16, "random", 3, torch.bfloat16, torch.float32)
    lean = timing.LayerInputs.for_dims(torch, {"H": 16, "HV": 32, "K": 128, "V": 128}, 2, 16, 3,
                                       torch.bfloat16, torch.float32)
    assert full.snapshots.shape == (2, 16, 32, 128, 128) and full.rpt.shape == (2, 16)
    assert not hasattr(lean, "snapshots") and not hasattr(lean, "rpt")
    for name in ("parents", "q", "k", "v", "a", "b", "A_log", "dt_bias", "pool", "slots", "accepted"):
        assert torch.equal(getattr(full, name), getattr(lean, name)), name  # the same draws
    fn = lambda: kernels.tree_verify_gated(lean.q, lean.k, lean.v, lean.a, lean.b, lean.A_log,  # noqa: E731
                                           lean.dt_bias, lean.pool, lean.slots, lean.parents, lean.cu,
                                           check_trees=False, max_nodes=16)
    assert timing.time_graph(torch, [fn, fn], rep_ms=20) > 0
    timer = timing.CudaGraphTimer(torch)
    graph = timer.capture([fn])
    assert timer.measure(graph, 10, 5) > 0
    assert timing.seconds_per_call(torch, graph.replay, 3, cuda=True) > 0
