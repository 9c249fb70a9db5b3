"""The steps `bole bench kernels` times, run on the CPU under Triton's interpreter with the
timer replaced by one call of each closure: what the timings leave in the pools is what the
agreement against SGLang reads next (experiments/NOTES.md "Measured on the H200 in the sixth
session")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bole_cli.bench import kernel_bench
from bole_cli.kernels.types import VerifyResult
from bole_cli.timing import LayerInputs


def _sets(count=2, batch=2, nodes=8):
    spec = SimpleNamespace(gdn_key_heads=1, gdn_value_heads=2, gdn_key_dim=16, gdn_value_dim=16)
    return [LayerInputs(torch, spec, batch, nodes, "random", 3 + i, torch.float32, torch.float32,
                        sglang_buffers=False, device="cpu") for i in range(count)]


@pytest.fixture
def one_call_timer(monkeypatch):
    """time_graph replaced by one call of each closure, in order (as a capture's warm-up)."""
    def run_once(torch_mod, fns, rep_ms=200, calls=None):
        for fn in fns:
            fn()
        return 1.0
    monkeypatch.setattr(kernel_bench, "time_graph", run_once)


def test_the_tables_timings_commit_only_factors_their_verify_wrote(one_call_timer):
    """The served verify (factors=False) leaves u and log_p unwritten in the buffers the
    tables' path shares; its Eq. 10 commit timed alone before the pairs committed that memory
    (NaN here) into the pools."""
    from bole_cli import kernels

    sets = _sets()
    outs = [VerifyResult.like(s.v) for s in sets]
    for s, o in zip(sets, outs):
        kernel_bench.bole_verify(s, kernels, o)()
        o.u.fill_(float("nan"))  # what the served verify leaves there: anything
        o.log_p.fill_(float("nan"))
    factors = [f for s, o in zip(sets, outs) for f in kernel_bench.factors_step(s, kernels, o)]
    kernel_bench.time_factors(torch, factors, len(sets))
    assert all(bool(torch.isfinite(s.pool).all()) for s in sets)
    assert all(bool(torch.isfinite(o.u).all()) for o in outs)  # the verify wrote them first
