"""The deferred write (docs/design.md §2 "Deferred write"): its bookkeeping kernels
(kernels/pending_chain.py) against their exact references, with counts and accepted nodes
outside their ranges (nothing written outside a request's segment), and the protocol
(bench/deferred_write.py) against the served step and a float64 recurrence over
consecutive steps, folds included. CPU: the interpreter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels import reference as ref
from bole_cli.kernels.pending_chain import pending_advance, pending_place
from bole_cli.kernels.types import DraftRows

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def rows_of(gen, n, h, hv, kd, vd, dtype=torch.float32) -> DraftRows:
    return DraftRows(torch.randn(n, h, kd, generator=gen).to(dtype), torch.randn(n, h, kd, generator=gen).to(dtype),
                     torch.randn(n, hv, vd, generator=gen).to(dtype), torch.randn(n, hv, generator=gen).to(dtype),
                     torch.randn(n, hv, generator=gen).to(dtype))


@SETTINGS
@given(bsz=st.integers(1, 4), nodes=st.integers(1, 5), room=st.integers(0, 6), h=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2, 4]), kd=st.sampled_from([4, 8]), vd=st.sampled_from([2, 8]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2 ** 16))
def test_place_matches_its_reference_and_stays_in_each_segment(bsz, nodes, room, h, group, kd, vd, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    width = nodes + room
    segment = rows_of(gen, bsz * width, h, h * group, kd, vd, dtype)
    draft = rows_of(gen, bsz * nodes, h, h * group, kd, vd, dtype)
    # counts in range, and (unchecked, as under a CUDA graph) below and past it: clamped
    pending = torch.randint(-3, room + 4, (bsz,), generator=gen, dtype=torch.int32)
    want, want_rows = ref.pending_place_ref(segment, draft, pending)
    rows = torch.full((bsz * nodes,), -7, dtype=torch.int64)
    pending_place(segment, draft, pending, rows, check_trees=False)
    assert torch.equal(rows, want_rows)
    for got, exp in zip(segment, want):
        assert torch.equal(got, exp)
    assert all(b * width <= int(r) < (b + 1) * width for b in range(bsz) for r in rows[b * nodes:(b + 1) * nodes])


@SETTINGS
@given(bsz=st.integers(1, 2100), nodes=st.integers(1, 8), room=st.integers(0, 20), seed=st.integers(0, 2 ** 16))
def test_advance_matches_its_reference(bsz, nodes, room, seed):
    """Every count and accepted node, in range and out (unchecked), over more requests than
    one program holds."""
    gen = torch.Generator().manual_seed(seed)
    width = nodes + room
    pending = torch.randint(-2, room + 3, (bsz,), generator=gen, dtype=torch.int32)
    accepted = torch.randint(-3, nodes + 2, (bsz,), generator=gen, dtype=torch.int64)
    want_fold, want_next = ref.pending_advance_ref(pending, accepted, nodes, width)
    fold = torch.full((bsz,), 99, dtype=torch.int32)
    pending_advance(pending, accepted, fold, draft_nodes=nodes, width=width, check_trees=False)
    assert fold.tolist() == want_fold and pending.tolist() == want_next


def test_advance_clamps_wide_values_before_narrowing_them():
    """int64 counts and accepted nodes past int32 (unchecked): clamped as the reference does,
    not wrapped into range (2**32 + 1 read as 1)."""
    big = 2 ** 32
    pending = torch.tensor([big + 1, -big, 1, 1], dtype=torch.int64)
    accepted = torch.tensor([0, 0, big, -big + 1], dtype=torch.int64)
    want_fold, want_next = ref.pending_advance_ref(pending, accepted, 2, 8)
    fold = torch.empty(4, dtype=torch.int64)
    pending_advance(pending, accepted, fold, draft_nodes=2, width=8, check_trees=False)
    assert fold.tolist() == want_fold == [6, -1, -1, -1] and pending.tolist() == want_next == [0, 1, 1, 1]


def test_the_segment_is_the_ring_length_where_it_holds_a_pending_row_in_one_tile():
    from bole_cli.bench.deferred_write import deferred_width

    assert [deferred_width(n) for n in (1, 2, 8, 15, 16, 17, 32, 33, 64)] == [16, 16, 16, 16, None, 32, None, 64,
                                                                               None]


def test_advance_folds_exactly_when_the_next_draft_would_not_fit():
    pending = torch.tensor([0, 5, 6, 6, 3], dtype=torch.int32)
    accepted = torch.tensor([1, 0, -1, 1, 1], dtype=torch.int32)
    fold = torch.empty(5, dtype=torch.int32)
    pending_advance(pending, accepted, fold, draft_nodes=2, width=8)
    # held 2, 6, 6, 8, 5 rows; the next draft of 2 fits 6 or fewer
    assert fold.tolist() == [-1, -1, -1, 7, -1] and pending.tolist() == [2, 6, 6, 0, 5]


def test_bad_counts_and_shapes_are_refused_by_name():
    gen = torch.Generator().manual_seed(0)
    segment, draft = rows_of(gen, 2 * 6, 1, 2, 4, 4), rows_of(gen, 2 * 2, 1, 2, 4, 4)
    rows = torch.empty(4, dtype=torch.int64)
    with pytest.raises(InputError, match="pending: request 1 has 5, outside 0..4"):
        pending_place(segment, draft, torch.tensor([0, 5], dtype=torch.int32), rows)
    with pytest.raises(InputError, match="^rows:"):
        pending_place(segment, draft, torch.zeros(2, dtype=torch.int32), torch.empty(4, dtype=torch.int32))
    with pytest.raises(InputError, match="^draft.a: expected"):  # v's heads are not a's
        pending_place(segment, draft._replace(v=draft.v[:, :1]), torch.zeros(2, dtype=torch.int32), rows)
    with pytest.raises(InputError, match="^draft: q .* do not match the segment's rows"):
        pending_place(segment, draft._replace(v=draft.v[:, :, :2].contiguous()), torch.zeros(2, dtype=torch.int32),
                      rows)
    with pytest.raises(InputError, match="^segment.k: expected"):
        pending_place(segment._replace(k=segment.k[:, :, :2].contiguous()), draft, torch.zeros(2, dtype=torch.int32),
                      rows)
    with pytest.raises(InputError, match="does not fit a segment of 1"):
        pending_place(rows_of(gen, 2, 1, 2, 4, 4), draft, torch.zeros(2, dtype=torch.int32), rows)
    with pytest.raises(InputError, match="^segment.q: each row must be contiguous"):
        strided = segment._replace(q=torch.randn(12, 4, 2, generator=gen).transpose(1, 2))
        pending_place(strided, draft, torch.zeros(2, dtype=torch.int32), rows)
    fold = torch.empty(2, dtype=torch.int32)
    with pytest.raises(InputError, match="accepted: request 0 has 2, outside -1..1"):
        pending_advance(torch.zeros(2, dtype=torch.int32), torch.tensor([2, 0]), fold, draft_nodes=2, width=6)
    with pytest.raises(InputError, match="pending: request 1 has 7, outside 0..4"):
        pending_advance(torch.tensor([0, 7], dtype=torch.int32), torch.tensor([0, 0]), fold, draft_nodes=2, width=6)
    with pytest.raises(InputError, match="draft_nodes: 3 does not fit a segment of width 2"):
        pending_advance(torch.zeros(2, dtype=torch.int32), torch.tensor([0, 0]), fold, draft_nodes=3, width=2)


def chain_sets(batch, nodes, count, group, seed, decay=1.0):
    """The bench's chain inputs (LayerInputs) on the CPU, small shapes, float32."""
    from bole_cli.timing import LayerInputs

    spec = SimpleNamespace(gdn_key_heads=2, gdn_value_heads=2 * group, gdn_key_dim=32, gdn_value_dim=16)
    sets = [LayerInputs(torch, spec, batch, nodes, "chain", seed + i, torch.float32, torch.float32,
                        sglang_buffers=False, device="cpu") for i in range(count)]
    for s in sets:
        s.A_log = sets[0].A_log + (decay - 1.0)  # one layer: the same gate parameters every step
        s.dt_bias = sets[0].dt_bias
    return sets


@pytest.mark.parametrize("group, decay", [(1, 1.0), (2, 4.0), (4, -4.0)])
def test_the_protocol_matches_a_float64_recurrence_step_by_step(group, decay):
    """Chains of 2 in segments of 6 over enough steps to fold every request: the drafts' o
    and the settled state against float64 at every step, and the pool written only by
    folds. decay 4: strong (g near -30 at large a), -4: near 0; GQA 1, 2 and 4."""
    from bole_cli import kernels
    from bole_cli.bench.deferred_write import PendingChains

    width = 6
    sets = chain_sets(2, 2, 3, group, seed=7 * group, decay=decay)
    s0 = sets[0]
    s0.accepted[0] = -1  # a request that accepts nothing on some steps
    for s in sets[1:]:
        s.accepted.fill_(1)  # and both nodes on the others: every request folds within the steps
    sets[2].accepted[1] = 2  # and a node outside the draft (unchecked, as in a graph): commits nothing
    chains = PendingChains(torch, s0, width)
    exact = s0.pool.double()
    sel = s0.slots.long()
    folds = 0
    for step in range(width):
        x = sets[step % len(sets)]
        before = s0.pool.clone()
        chains.verify(torch, kernels, DraftRows(x.q, x.k, x.v, x.a, x.b))
        g, beta = ref.gdn_gates_ref(s0.A_log, x.a, s0.dt_bias, x.b)
        want = ref.tree_verify_ref(x.q.double(), x.k.double(), x.v.double(), g, beta, exact, s0.slots, x.parents,
                                   x.cu)
        assert (chains.o.double() - want.o).norm() / want.o.norm() < 1e-5
        chains.commit(kernels, x.accepted)
        taken = torch.where(x.accepted < x.nodes, x.accepted, -1)
        exact = ref.tree_commit_replay_ref(exact, s0.slots, x.k.double(), x.v.double(), g, beta, x.parents, x.cu,
                                           taken)
        settled = chains.settled(kernels).double()
        assert ((settled[sel] - exact[sel]).norm() / exact[sel].norm()) < 1e-5
        folded = chains.fold >= 0
        folds += int(folded.sum())
        untouched = sel[~folded]
        assert torch.equal(s0.pool[untouched], before[untouched])  # deferred: not written
    assert folds >= 2


def test_the_protocol_refuses_what_it_cannot_verify():
    from bole_cli.bench.deferred_write import PendingChains

    (s,) = chain_sets(2, 2, 1, 1, seed=1)
    with pytest.raises(InputError, match="^width: 2 must exceed"):
        PendingChains(torch, s, 2)
    with pytest.raises(InputError, match="^width: 128 must exceed"):
        PendingChains(torch, s, 128)
    s.parents[1] = -1  # two roots: not a chain
    with pytest.raises(InputError, match="^parents: the deferred write takes chains only"):
        PendingChains(torch, s, 8)


def test_a_miscounted_advance_is_caught_by_the_agreement(monkeypatch):
    """The bench's agreement (the GPU run's code) passes the protocol and leaves the pool as
    it was; pending rows counted one short (the last accepted row never folded) differ far
    outside the tolerances."""
    from bole_cli import kernels
    from bole_cli.bench import deferred_write
    from bole_cli.bench import kernel_bench
    from bole_cli.bench.kernel_bench import AGREEMENT

    sets = chain_sets(2, 2, 2, 1, seed=3)
    for s in sets:
        s.accepted.fill_(1)
    pool0 = sets[0].pool.clone()
    diff_o, diff_state = kernel_bench.deferred_agreement(torch, kernels, sets, pool0, 6)
    assert diff_o < 1e-5 and diff_state < 1e-6, (diff_o, diff_state)
    assert torch.equal(sets[0].pool, pool0)
    real = deferred_write.PendingChains.commit

    def short(self, kernels_, accepted):
        real(self, kernels_, accepted)
        self.pending.sub_(1).clamp_(min=0)

    monkeypatch.setattr(deferred_write.PendingChains, "commit", short)
    diff_o, diff_state = kernel_bench.deferred_agreement(torch, kernels, sets, pool0, 6)
    assert diff_state > 10 * AGREEMENT["state float32"] and diff_o > AGREEMENT["o"], (diff_o, diff_state)


def test_steady_timing_replays_consecutive_steps_of_every_set_interleaved(monkeypatch):
    """The ring and the deferred write are timed over STEADY_STEPS consecutive steps a
    replay (their flushes and folds inside it), the input sets interleaved step by step."""
    from bole_cli.bench import kernel_bench

    seen = {}
    monkeypatch.setattr(kernel_bench, "time_graph",
                        lambda torch_, fns, calls=None: seen.update(fns=fns, calls=calls) or 32.0)
    v0, c0, v1, c1 = object(), object(), object(), object()
    assert kernel_bench.time_steady(torch, [[v0, c0], [v1, c1]]) == 32.0
    assert seen == {"fns": [v0, c0, v1, c1] * kernel_bench.STEADY_STEPS, "calls": 2 * kernel_bench.STEADY_STEPS}
    assert kernel_bench.STEADY_STEPS >= 16 - 2  # a chain of 2 accepting one row a step folds within it


@pytest.mark.gpu
def test_the_protocol_on_a_gpu_at_the_9b_shape_agrees_and_captures():
    """The bench's cell on the GPU (9B GDN shape, bf16 activations, tf32 verify): the
    drafts' o within bf16 noise of the served step's and the settled state the served
    one's to float32, over enough steps to fold every request; one step captured in a CUDA
    graph and timed (no host read inside)."""
    from bole_cli import kernels
    from bole_cli.bench.deferred_write import PendingChains, deferred_width
    from bole_cli.bench.kernel_bench import deferred_agreement
    from bole_cli.catalog.models import resolve_model
    from bole_cli.bench.kernel_bench import time_steady
    from bole_cli.timing import LayerInputs

    spec = resolve_model("9b")
    width = deferred_width(2)
    assert width == 16
    sets = [LayerInputs(torch, spec, 4, 2, "chain", 5 + i, torch.bfloat16, torch.float32, sglang_buffers=False)
            for i in range(3)]
    for s in sets:
        s.A_log, s.dt_bias = sets[0].A_log, sets[0].dt_bias
    pool0 = sets[0].pool.clone()
    diff_o, diff_state = deferred_agreement(torch, kernels, sets, pool0, width)
    assert diff_o < 1e-2 and diff_state < 1e-6, (diff_o, diff_state)
    chains = PendingChains(torch, sets[1], width)
    step = [lambda: chains.verify(torch, kernels), lambda: chains.commit(kernels, sets[1].accepted)]
    assert time_steady(torch, [step]) > 0
    assert bool(torch.isfinite(chains.settled(kernels)).all())  # many replays of steps, folds among them
