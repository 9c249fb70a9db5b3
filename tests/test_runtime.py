"""The embedded runtime on a tiny hybrid model on CPU (float64, reference GDN ops):
tree verify + commit is exactly sequential decoding, for Bole's factors and for the
snapshot baseline; MoE dispatch is the per-token definition; the three decoders
(autoregressive, snapshot tree, Bole) emit the same greedy token stream."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from bole_cli.errors import BoleError, InputError
from bole_cli.runtime import HybridModel, SnapshotGDN, param_bytes, tiny_spec
from bole_cli.runtime.model import gdn_proj_width
from bole_cli.runtime.moe import grouped_mm_works, moe_forward, moe_naive
from bole_cli.runtime.timer import HybridForwardTimer, estimate_memory, tree_sizes
from bole_cli.trees import ProposalTree, chain_tree, pack_forest, random_tree

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-9)
VOCAB = 128


def tree(parents):
    return ProposalTree(parents, [0.0] * len(parents))


@pytest.fixture(scope="module")
def dense():
    return HybridModel(tiny_spec(), "cpu", F64, seed=0, gdn_backend="reference")


@pytest.fixture(scope="module")
def moe_model():
    return HybridModel(tiny_spec(moe=True, layers=4), "cpu", F64, seed=0, gdn_backend="reference")


def warm_cache(model, prefix=(5, 3, 7), max_len=48, seed=1):
    """Slots with different committed lengths and non-trivial states (decoded one by one)."""
    cache = model.new_cache(len(prefix), max_len)
    gen = torch.Generator().manual_seed(seed)
    for slot, n in enumerate(prefix):
        for _ in range(n):
            model.decode(cache, torch.randint(VOCAB, (1,), generator=gen), [slot])
    return cache


def decode_path(model, cache, slot, tokens):
    """Decode `tokens` one at a time on one slot; the logits of each step."""
    return [model.decode(cache, [t], [slot])[0] for t in tokens]


def assert_slot_equal(a, b, slot):
    assert a.kv_lens[slot] == b.kv_lens[slot]
    n = a.kv_lens[slot]
    torch.testing.assert_close(a.gdn_state[:, slot], b.gdn_state[:, slot], **TOL)
    torch.testing.assert_close(a.conv_state[:, slot], b.conv_state[:, slot], **TOL)
    torch.testing.assert_close(a.k_cache[:, slot, :, :n], b.k_cache[:, slot, :, :n], **TOL)
    torch.testing.assert_close(a.v_cache[:, slot, :, :n], b.v_cache[:, slot, :, :n], **TOL)


def path_to(parents, node):
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


# ---- structure ---------------------------------------------------------------------------

def test_param_bytes_formula_matches_allocation(dense, moe_model):
    for m in (dense, moe_model):
        assert m.param_bytes == param_bytes(m.spec, F64)
    est = estimate_memory(dense.spec, F64, batch=2, kv_len=10, n_tree_tokens=6)
    assert est["weights"] == dense.param_bytes
    cache = dense.new_cache(2, 10 + 3)
    states = est["kv_cache"] + est["gdn_states"] + est["conv_windows"]
    assert states == cache.nbytes


def test_batched_decode_equals_one_slot_at_a_time(dense):
    cache = warm_cache(dense)
    alone = cache.clone()
    toks = [11, 22, 33]
    batched = dense.decode(cache, toks, [2, 0, 1])  # uneven lengths: masked attention, gathered KV
    for row, (slot, t) in enumerate(zip([2, 0, 1], toks)):
        torch.testing.assert_close(batched[row], decode_path(dense, alone, slot, [t])[0], **TOL)
    for slot in range(3):
        assert_slot_equal(cache, alone, slot)


@pytest.mark.parametrize("core", ["tree", "fused"])
def test_decode_cores_agree(dense, core):
    """The one-token GDN recurrence, one-node tree_verify + tree_commit and the fused
    decode (its float64 reference here) are the same step."""
    other = HybridModel(dense.spec, "cpu", F64, seed=0, gdn_backend="reference", gdn_decode=core)
    a, b = warm_cache(dense), warm_cache(other)
    for toks in ([1, 2, 3], [4, 5, 6]):
        torch.testing.assert_close(other.decode(b, toks), dense.decode(a, toks), **TOL)
    for slot in range(3):
        assert_slot_equal(a, b, slot)


# ---- (1) a chain verify is T decode steps ------------------------------------------------

@pytest.mark.parametrize("which", ["dense", "moe"])
@pytest.mark.parametrize("path", ["bole", "snapshot"])
def test_chain_verify_equals_sequential_decode(which, path, dense, moe_model):
    model = dense if which == "dense" else moe_model
    cache = warm_cache(model)
    seq = cache.clone()
    t = 5
    slots = [2, 0]
    toks = torch.randint(VOCAB, (2 * t,), generator=torch.Generator().manual_seed(3))
    out = model.verify(cache, pack_forest([chain_tree(t), chain_tree(t)]), toks, slots, path=path)
    for b, slot in enumerate(slots):
        ref = torch.stack(decode_path(model, seq, slot, toks[b * t:(b + 1) * t].tolist()))
        torch.testing.assert_close(out.logits[b * t:(b + 1) * t], ref, **TOL)
    model.commit(cache, out, [t - 1, t - 1])
    for slot in range(3):
        assert_slot_equal(cache, seq, slot)


# ---- (2) every node of a branching forest gets its root path's logits ------------------

@pytest.mark.parametrize("prefix", [(5, 3, 7), (4, 4, 4)], ids=["dense-mask", "split-attention"])
@pytest.mark.parametrize("full", [False, True], ids=["padded", "full"])
def test_tree_verify_logits_equal_root_path_decode(prefix, full, dense):
    """full: every tree of the same size, so the attention's padded layout is the packed rows."""
    cache = warm_cache(dense, prefix)
    trees = [tree([-1, 0, 0, 1, 1, 2, 4, 4, 6]),  # branching, depth 5
             tree([-1, -1, 0, 1, -1, 2]),  # several roots
             random_tree(7, 10, max_depth=4)]
    if full:
        trees = [trees[0], tree([-1, -1, 0, 1, -1, 2, 3, 0, 1]), random_tree(7, 9, max_depth=4)]
    forest = pack_forest(trees)
    slots = [1, 2, 0]
    toks = torch.randint(VOCAB, (forest.n_nodes,), generator=torch.Generator().manual_seed(4))
    out = dense.verify(cache, forest, toks, slots)
    assert (out.batch.split_base is not None) == (len(set(prefix)) == 1)
    assert out.batch.full == full
    for b, (tr, slot) in enumerate(zip(trees, slots)):
        start = forest.cu_seqlens[b]
        for i in range(tr.n_nodes):
            path = path_to(tr.parents, i)
            ref = decode_path(dense, cache.clone(), slot, [int(toks[start + j]) for j in path])[-1]
            torch.testing.assert_close(out.logits[start + i], ref, **TOL)


# ---- (3) the commit of an accepted node is the state after decoding its path ------------

@pytest.mark.parametrize("path", ["bole", "snapshot"])
def test_commit_equals_decoding_the_accepted_path(path, dense):
    cache = warm_cache(dense)
    trees = [tree([-1, 0, 0, 1, 3, 2, 5]), tree([-1, 0, 1]), tree([-1, -1, 1, 0, 2, 4])]
    forest = pack_forest(trees)
    slots = [2, 1, 0]
    accepted = [6, -1, 5]  # a deep branch, nothing (the slot stays as it was), a second root's chain
    toks = torch.randint(VOCAB, (forest.n_nodes,), generator=torch.Generator().manual_seed(5))
    seq = cache.clone()
    out = dense.verify(cache, forest, toks, slots, path=path)
    dense.commit(cache, out, accepted)
    for b, (tr, slot, a) in enumerate(zip(trees, slots, accepted)):
        if a >= 0:
            decode_path(dense, seq, slot, [int(toks[forest.cu_seqlens[b] + j]) for j in path_to(tr.parents, a)])
    for slot in range(3):
        assert_slot_equal(cache, seq, slot)
    # the next step sees the committed prefix exactly
    torch.testing.assert_close(dense.decode(cache, [7, 8, 9], slots), dense.decode(seq, [7, 8, 9], slots), **TOL)


def test_empty_request_and_bucketed_kv_reads(dense):
    """A request with no tree nodes, and the bucketed (masked) KV reads the e2e decoders'
    CUDA graphs replay (kv_bucket rounds the read length up): the same results as the plain
    calls."""
    cache = warm_cache(dense)
    plain = cache.clone()
    forest = ([-1, 0, 1, -1, 0], [0, 3, 3, 5])  # request 1 owns no node
    toks = [4, 5, 6, 7, 8]
    tb = dense.prepare_verify(cache, forest, toks, [0, 1, 2], kv_bucket=8)
    assert tb.kv_limit % 8 == 0
    got = dense.forward_verify(cache, tb, path="snapshot")
    want = dense.verify(plain, forest, toks, [0, 1, 2])
    torch.testing.assert_close(got.logits, want.logits, **TOL)
    dense.commit(cache, got, [1, -1, 0])
    dense.commit(plain, want, [1, -1, 0])
    db = dense.prepare_decode(cache, [1, 2, 3], [0, 1, 2], kv_bucket=8)
    assert db.kv_limit % 8 == 0
    got_decode = dense.forward_decode(cache, db)
    for s in range(3):
        cache.kv_lens[s] += 1
    torch.testing.assert_close(got_decode, dense.decode(plain, [1, 2, 3]), **TOL)
    for slot in range(3):
        assert_slot_equal(cache, plain, slot)


def _reference_flash_varlen(lse_2d: bool):
    """flash_varlen's contract in float64 loops: per request, the first used[b] keys from
    row cu_k[b] of the strided key view; lse [heads, total_q] or [B, heads, max_q]."""
    def run(q, k, v, cu_q, cu_k, max_q, max_k, used):
        total, heads, d = q.shape
        group = heads // k.shape[1]
        out, lse = torch.zeros_like(q), torch.full((heads, total), float("nan"), dtype=torch.float64)
        for b in range(len(cu_q) - 1):
            q0, q1, k0, n = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(used[b])
            keys = k[k0:k0 + n].repeat_interleave(group, dim=1)
            vals = v[k0:k0 + n].repeat_interleave(group, dim=1)
            s = torch.einsum("qhd,khd->hqk", q[q0:q1], keys) * d ** -0.5
            out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vals)
            lse[:, q0:q1] = torch.logsumexp(s, -1)
        if lse_2d:
            return out, lse
        per = torch.full((len(cu_q) - 1, heads, max_q), float("nan"), dtype=torch.float64)
        for b in range(len(cu_q) - 1):
            per[b, :, : int(cu_q[b + 1] - cu_q[b])] = lse[:, int(cu_q[b]):int(cu_q[b + 1])]
        return out, per
    return run


@pytest.mark.parametrize("lse_2d", [True, False], ids=["lse-heads-total", "lse-batch-heads"])
def test_varlen_attention_equals_the_dense_mask(lse_2d, dense, monkeypatch):
    """The bucketed read (one graph for all steps, as bench e2e runs) through flash varlen
    over each request's keys, read in place from the cache (a float64 stand-in for the CUDA
    kernel): the same logits as the dense mask, for trees and decode; slots that do not
    increase keep the dense mask."""
    from bole_cli.runtime import attention

    monkeypatch.setattr(attention, "flash_varlen", _reference_flash_varlen(lse_2d))
    cache = warm_cache(dense, (5, 3, 7))
    forest = pack_forest([tree([-1, 0, 0, 1, 1, 2]), tree([-1, -1, 0]), random_tree(3, 7, max_depth=3)])
    toks = torch.randint(VOCAB, (forest.n_nodes,), generator=torch.Generator().manual_seed(6))
    want = dense.verify(cache.clone(), forest, toks, [0, 1, 2])
    assert want.batch.kv_used is None and want.batch.attn_bias is not None
    monkeypatch.setattr(dense, "varlen_attention", True)
    for bucket in (1, 16):
        tb = dense.prepare_verify(cache, forest, toks, [0, 1, 2], kv_bucket=bucket)
        assert tb.kv_used.tolist() == [5, 3, 7] and tb.attn_bias is None
        got = dense.forward_verify(cache.clone(), tb)
        torch.testing.assert_close(got.logits, want.logits, **TOL)
    assert dense.prepare_verify(cache, forest, toks, [2, 1, 0], kv_bucket=16).kv_used is None
    db = dense.prepare_decode(cache, [1, 2, 3], [0, 1, 2], kv_bucket=16)
    assert db.kv_used.tolist() == [6, 4, 8] and db.attn_bias is None
    got = dense.forward_decode(cache.clone(), db)
    monkeypatch.setattr(dense, "varlen_attention", False)
    torch.testing.assert_close(got, dense.decode(cache.clone(), [1, 2, 3], [0, 1, 2]), **TOL)


def test_varlen_attention_with_gaps_empty_trees_and_empty_requests(dense, monkeypatch):
    """Slots with gaps and a request owning no tree node read right through the strided
    view; a request with no committed key keeps the dense mask (flash's lse would be +inf)."""
    from bole_cli.runtime import attention

    monkeypatch.setattr(attention, "flash_varlen", _reference_flash_varlen(True))
    cache = warm_cache(dense, (5, 0, 3, 7))
    forest = ([-1, 0, 1, -1, 0], [0, 3, 3, 5])  # the second request owns no node
    toks = [4, 5, 6, 7, 8]
    want = dense.verify(cache.clone(), forest, toks, [0, 2, 3])
    want_dec = dense.decode(cache.clone(), [1, 2, 3], [0, 2, 3])
    monkeypatch.setattr(dense, "varlen_attention", True)
    tb = dense.prepare_verify(cache, forest, toks, [0, 2, 3], kv_bucket=16)
    assert tb.kv_used.tolist() == [5, 3, 7]
    torch.testing.assert_close(dense.forward_verify(cache.clone(), tb).logits, want.logits, **TOL)
    db = dense.prepare_decode(cache, [1, 2, 3], [0, 2, 3], kv_bucket=16)
    assert db.kv_used.tolist() == [6, 4, 8]
    torch.testing.assert_close(dense.forward_decode(cache.clone(), db), want_dec, **TOL)
    assert dense.prepare_verify(cache, forest, toks, [0, 1, 3], kv_bucket=16).kv_used is None
    kc = cache.k_cache[0][:, :, :20]  # a view of the first keys: not the layer's whole cache
    with pytest.raises(ValueError, match="contiguous"):
        attention.varlen_cache_attention(torch.zeros(3, kc.shape[1], 2, kc.shape[3], dtype=F64), kc, kc,
                                         torch.tensor([0, 2, 3]), torch.tensor([5, 3, 7], dtype=torch.int32))


def test_snapshot_buffer_holds_every_node_state(dense):
    """The baseline really stores one full state per node ([L, B, T+1, HV, V, K])."""
    cache = warm_cache(dense, prefix=(4, 6))
    forest = pack_forest([tree([-1, 0, 0, 2]), tree([-1, 0])])
    out = dense.verify(cache, forest, [1, 2, 3, 4, 5, 6], [0, 1], path="snapshot")
    s = dense.spec
    assert out.snapshots.shape == (dense.n_gdn, 2, 5, s.gdn_value_heads, s.gdn_value_dim, s.gdn_key_dim)
    seq = cache.clone()
    decode_path(dense, seq, 0, [1, 3, 4])  # root path of node 3 in request 0
    torch.testing.assert_close(out.snapshots[:, 0, 4], seq.gdn_state[:, 0], **TOL)


# ---- (4) MoE dispatch ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_moe_dispatch_equals_per_token_loop(dtype):
    gen = torch.Generator().manual_seed(0)
    n, hidden, experts, ffn, k = 37, 32, 8, 16, 3
    x = torch.randn(n, hidden, generator=gen, dtype=dtype)
    router = torch.randn(experts, hidden, generator=gen, dtype=dtype)
    w13 = torch.randn(experts, 2 * ffn, hidden, generator=gen, dtype=dtype) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, ffn, generator=gen, dtype=dtype) / ffn ** 0.5
    want = moe_naive(x, router, w13, w2, k)
    tol = TOL if dtype == F64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(moe_forward(x, router, w13, w2, k, grouped=False), want, **tol)
    if grouped_mm_works("cpu", dtype):
        torch.testing.assert_close(moe_forward(x, router, w13, w2, k, grouped=True), want, **tol)
    else:
        assert dtype == F64  # torch._grouped_mm takes float32/bf16/fp16 only


# ---- issue 8's check: three decoders, one greedy stream ----------------------------------

def _greedy_run(model, path, steps, seed=0):
    """Greedy speculative decoding of one request; path None = autoregressive."""
    rng = random.Random(seed)
    cache = model.new_cache(1, 96)
    decode_path(model, cache, 0, [3, 1, 4, 1, 5])
    pending, stream = 9, []
    while len(stream) < steps:
        if path is None:
            pending = int(model.decode(cache, [pending], [0])[0].argmax())
            stream.append(pending)
            continue
        # a drafter that knows the greedy continuation but errs: a true chain cut at a
        # random depth by a wrong token, plus a random side branch
        oracle = cache.clone()
        truth, t = [], pending
        for _ in range(4):
            t = int(model.decode(oracle, [t], [0])[0].argmax())
            truth.append(t)
        cut = rng.randint(0, 4)
        chain = truth[:cut] + [(truth[cut] + 1) % VOCAB if cut < 4 else truth[-1]]
        parents = [-1] + list(range(len(chain))) + [0, len(chain) + 1]
        toks = [pending] + chain + [rng.randrange(VOCAB), rng.randrange(VOCAB)]
        out = model.verify(cache, pack_forest([tree(parents)]), toks, [0], path=path)
        node = 0
        while True:  # greedy acceptance: follow the child holding the argmax token
            want = int(out.logits[node].argmax())
            kids = [j for j, p in enumerate(parents) if p == node and toks[j] == want]
            if not kids:
                break
            node = kids[0]
            stream.append(want)
        model.commit(cache, out, [node])
        pending = want
        stream.append(want)
    return stream[:steps]


def test_three_decoders_emit_the_same_greedy_stream(dense):
    ar = _greedy_run(dense, None, 14)
    assert _greedy_run(dense, "bole", 14) == ar
    assert _greedy_run(dense, "snapshot", 14) == ar


# ---- errors and the timer ----------------------------------------------------------------

def test_bad_inputs_are_named(dense):
    cache = dense.new_cache(2, 8)
    with pytest.raises(InputError, match="parent"):
        dense.verify(cache, ([-1, 1], [0, 2]), [1, 2], [0])
    with pytest.raises(InputError, match="slot"):
        dense.decode(cache, [1, 2], [0, 0])
    with pytest.raises(InputError, match="KV positions"):
        dense.verify(cache, pack_forest([chain_tree(9)]), list(range(9)), [0])
    out = dense.verify(cache, pack_forest([chain_tree(2)]), [1, 2], [1])
    with pytest.raises(InputError, match="accepted"):
        dense.commit(cache, out, [2])


def test_timer_runs_and_samples_on_cpu():
    spec = tiny_spec(layers=12)
    from bole_cli.calibrate.sweep import StepTimer

    full = HybridForwardTimer(spec, "cpu", torch.float32, inner=1)
    assert isinstance(full, StepTimer)
    assert full.time_decode(2, 16) > 0
    assert full.time_verify(2, 16, 9) > 0
    assert not full.info()["sampled"] and full.info()["cuda_graphs"] is False
    assert full.info()["cache_attention_launch_rule"] is None  # float32 on CPU: no cache kernel, no launch rule
    full.model.cache_kernel = True
    from bole_cli.kernels.cache_attention import LAUNCH_RULE

    assert full.info()["cache_attention_launch_rule"] == LAUNCH_RULE
    sampled = HybridForwardTimer(spec, "cpu", torch.float32, layers_sample=1, inner=1, path="snapshot")
    assert sampled.model.spec.layers == 4 and sampled.info()["sampled"]
    assert sampled.time_verify(3, 8, 7) > 0
    assert tree_sizes(3, 7) == [3, 2, 2]
    with pytest.raises(InputError, match="at least"):
        full.time_verify(4, 16, 3)


def test_timer_refuses_a_model_that_does_not_fit():
    spec = tiny_spec()
    need = estimate_memory(spec, torch.float32, batch=1, kv_len=1)["total"]
    with pytest.raises(BoleError, match="layers_sample"):
        HybridForwardTimer(spec, "cpu", torch.float32, free_bytes=need // 2)
    timer = HybridForwardTimer(spec, "cpu", torch.float32, free_bytes=need + 4096)
    with pytest.raises(BoleError, match="kv_len 100000"):
        timer.time_decode(64, 100_000)


# ---- through the Triton kernels (interpreted on CPU) and SGLang's verifier ---------------

def test_kernel_path_matches_sequential_decode():
    spec = tiny_spec(layers=4)
    model = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="kernels", gdn_decode="recurrent")
    assert all(v == "triton" for v in model.ops.describe().values())
    cache = warm_cache(model, prefix=(3, 2), max_len=16)
    seq = cache.clone()
    forest = pack_forest([tree([-1, 0, 1, 0]), chain_tree(3)])
    toks = [5, 6, 7, 8, 9, 10, 11]
    out = model.verify(cache, forest, toks, [0, 1])
    model.commit(cache, out, [2, 2])
    ref0 = decode_path(model, seq, 0, [5, 6, 7])
    ref1 = decode_path(model, seq, 1, [9, 10, 11])
    tol = dict(atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(out.logits[[0, 1, 2, 4, 5, 6]], torch.stack(ref0 + ref1), **tol)
    for slot in (0, 1):
        assert seq.kv_lens[slot] == cache.kv_lens[slot]
        torch.testing.assert_close(cache.gdn_state[:, slot], seq.gdn_state[:, slot], **tol)
        torch.testing.assert_close(cache.conv_state[:, slot], seq.conv_state[:, slot], **tol)
    # the kernels' one-node trees, and the fused decode kernel (the CUDA default), as the GDN
    # core of a plain decode step
    for core, toks in (("tree", [1, 2]), ("fused", [3, 4])):
        other = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="kernels", gdn_decode=core)
        torch.testing.assert_close(other.decode(cache, toks), model.decode(seq, toks), **tol)
        torch.testing.assert_close(cache.gdn_state, seq.gdn_state, **tol)
        torch.testing.assert_close(cache.conv_state, seq.conv_state, **tol)


def _sglang():
    try:
        from bole_cli.runtime import load_sglang_gdn

        return load_sglang_gdn()
    except Exception:  # noqa: BLE001 - no wheel, no loader: the test says so
        return None


def test_sglang_snapshot_engine_matches_torch_engine():
    kernels = _sglang()
    if kernels is None:
        pytest.skip("SGLang 0.5.23's kernels cannot be loaded here (no wheel found)")
    spec = tiny_spec(layers=4)
    model = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="reference",
                        snapshot=SnapshotGDN(kernels))
    cache = warm_cache(model, prefix=(3, 2), max_len=16)
    forest = pack_forest([tree([-1, 0, 1, 0]), tree([-1, 0, 0])])
    toks = [5, 6, 7, 8, 9, 10, 11]
    torch_engine = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="reference")
    mine = cache.clone()
    want = torch_engine.verify(mine, forest, toks, [1, 0], path="snapshot")
    got = model.verify(cache, forest, toks, [1, 0], path="snapshot")
    tol = dict(atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(got.logits, want.logits, **tol)
    for b, size in enumerate(forest.sizes):  # rows past a request's tree are padding
        torch.testing.assert_close(got.snapshots[:, b, 1:size + 1], want.snapshots[:, b, 1:size + 1], **tol)
    model.commit(cache, got, [2, 1])
    torch_engine.commit(mine, want, [2, 1])
    torch.testing.assert_close(cache.gdn_state, mine.gdn_state, **tol)
    # SGLang's fused one-token decode as the GDN core of a plain decode step
    fused = HybridModel(spec, "cpu", torch.float32, seed=0, gdn_backend="reference",
                        snapshot=SnapshotGDN(kernels), gdn_decode="sglang")
    torch.testing.assert_close(fused.decode(cache, [3, 4]), torch_engine.decode(mine, [3, 4]), **tol)
    torch.testing.assert_close(cache.gdn_state, mine.gdn_state, **tol)


def test_fused_pieces_compile_whole_and_agree():
    """runtime.fusion's pieces trace as single graphs (fullgraph: a graph break fails),
    through AOT autograd's functionalisation as inductor sees them, and the compiled model
    decodes and verifies as the eager one does (inductor itself runs in the GPU suite)."""
    from bole_cli.runtime.fusion import Fusion

    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False, cache_kernel=True)  # the CUDA defaults' paths
    eager = HybridModel(spec, "cpu", torch.float32, **kw)
    traced = HybridModel(spec, "cpu", torch.float32, **kw)
    traced.fuse = Fusion(True, backend="aot_eager")
    # equal lengths: the split verify (its attention one kernel, its other pieces compiled)
    assert_step_agrees(traced, eager, (3, 3), dict(atol=1e-5, rtol=1e-5))
    # the MTP head's input (the drafter's): embedding, two norms and the concatenation, one graph
    gen = torch.Generator().manual_seed(0)
    args = (torch.tensor([3, 1, 4]), torch.randn(VOCAB, spec.hidden, generator=gen),
            torch.randn(3, spec.hidden, generator=gen), torch.rand(spec.hidden, generator=gen),
            torch.rand(spec.hidden, generator=gen))
    torch.testing.assert_close(traced.fuse.mtp_in(*args), eager.fuse.mtp_in(*args))
    want = torch.cat([F.rms_norm(args[1][args[0]], (spec.hidden,), args[3], 1e-6),
                      F.rms_norm(args[2], (spec.hidden,), args[4], 1e-6)], dim=-1)
    torch.testing.assert_close(eager.fuse.mtp_in(*args), want)
    # a layer's first norm (no residual add) through the compiled norm, one graph
    from bole_cli.runtime.fusion import NormedRows

    x, w = args[2], args[3]
    torch.testing.assert_close(NormedRows(x, None, w, traced.fuse).rows(), F.rms_norm(x, (spec.hidden,), w, 1e-6))


def assert_step_agrees(model, ref, prefix, tol):
    """A decode and a two-request verify give the same logits on the two models."""
    a, b = warm_cache(ref, prefix=prefix, max_len=16), warm_cache(model, prefix=prefix, max_len=16)
    torch.testing.assert_close(model.decode(b, [1, 2]), ref.decode(a, [1, 2]), **tol)
    forest = pack_forest([tree([-1, 0, 1, 0]), chain_tree(3)])
    got = model.verify(b, forest, [5, 6, 7, 8, 9, 10, 11], [0, 1])
    want = ref.verify(a, forest, [5, 6, 7, 8, 9, 10, 11], [0, 1])
    torch.testing.assert_close(got.logits, want.logits, **tol)


def test_serving_step_is_a_whole_verify_and_commit():
    """The timed serving step (inputs copied once, metadata derived on the device, forward
    and commit as one replayable call) leaves the cache as verify + commit does."""
    timer = HybridForwardTimer(tiny_spec(layers=4), "cpu", F64, serving_step=True, inner=1, gdn_backend="reference")
    assert timer.time_decode(2, 8) > 0
    assert timer.time_verify(2, 8, 6) > 0  # builds the step and runs it once
    cache, model = timer._cache, timer.model
    before = cache.clone()
    timer.time_verify(2, 8, 6)  # one more step
    trees, forest = timer._steps[("prepared-trees", "verify", "bole", 2, 8, 6)]
    deepest = [max(range(t.n_nodes), key=lambda i: t.depths[i]) for t in trees]
    out = model.verify(before, forest, timer._tokens(6, seed=6), [0, 1])
    model.commit(before, out, deepest)
    torch.testing.assert_close(cache.gdn_state, before.gdn_state, **TOL)
    torch.testing.assert_close(cache.conv_state, before.conv_state, **TOL)
    torch.testing.assert_close(cache.k_cache, before.k_cache, **TOL)


@pytest.mark.parametrize("prefix", [(3, 3), (3, 2)])  # equal lengths (split verify) and not (dense)
def test_cache_attention_kernel_path_agrees(prefix):
    """Decode and verify with the attention to the committed keys through the split-key
    kernel (the CUDA default) give what the SDPA paths give."""
    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    plain = HybridModel(spec, "cpu", torch.float32, cache_kernel=False, **kw)
    kernel = HybridModel(spec, "cpu", torch.float32, cache_kernel=True, **kw)
    assert_step_agrees(kernel, plain, prefix, dict(atol=2e-4, rtol=2e-4))


def test_verify_keeps_the_commit_rows_without_copies(dense):
    """x is a view of every layer's in_proj output and k, v views of the conv outputs (no
    copy a layer); the e2e bench counts the whole conv-output buffer a Bole verify holds."""
    from bole_cli.bench.e2e.decoders import bole_rows

    s = dense.spec
    cache = warm_cache(dense)
    forest = pack_forest([tree([-1, 0, 0, 1]), tree([-1, 0])])
    toks = torch.randint(VOCAB, (forest.n_nodes,), generator=torch.Generator().manual_seed(2))
    out = dense.verify(cache, forest, toks, [0, 1])
    kd = s.gdn_key_heads * s.gdn_key_dim
    assert out.k.data_ptr() == out.conv_out[..., kd:].data_ptr() and out.v.data_ptr() == out.conv_out[..., 2 * kd:].data_ptr()
    assert out.x.stride(1) == gdn_proj_width(s) and out.x.shape[-1] == s.conv_dim
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    cd, zd = s.conv_dim, s.gdn_value_heads * s.gdn_value_dim  # b and a: the in_proj's last columns
    col = out.x.element_size()
    assert out.b.data_ptr() == out.x.data_ptr() + (cd + zd) * col and out.b.stride() == out.x.stride()
    assert out.a.data_ptr() == out.b.data_ptr() + s.gdn_value_heads * col and out.a.shape == out.b.shape
    held = size(out.conv_out) + size(out.u) + size(out.log_p)
    assert sum(size(t) for t in bole_rows(out)) == held


@pytest.mark.parametrize("prefix", [(3, 3), (3, 2)])
def test_attention_in_kernel_path_agrees(prefix, monkeypatch):
    """An attention layer's q/k norm, RoPE and cache writes through kernels.attention_in (one
    launch) give the compiled pieces' logits and caches, in a decode and a verify."""
    import importlib

    mod = importlib.import_module("bole_cli.kernels.attention_in")  # the module, not the package's function
    calls = []
    kernel = mod.attention_in
    monkeypatch.setattr(mod, "attention_in", lambda *a, **kw: calls.append(kw["k_out"]) or kernel(*a, **kw))
    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    plain = HybridModel(spec, "cpu", torch.float32, attention_in_kernel=False, **kw)
    fused = HybridModel(spec, "cpu", torch.float32, attention_in_kernel=True, **kw)
    assert not HybridModel(spec, "cpu", torch.bfloat16, **kw).attention_in_kernel  # default: CUDA 16-bit
    assert_step_agrees(fused, plain, prefix, dict(atol=1e-5, rtol=1e-5))
    a, b = warm_cache(plain, prefix=prefix, max_len=16), warm_cache(fused, prefix=prefix, max_len=16)
    plain.decode(a, [1, 2])
    fused.decode(b, [1, 2])
    torch.testing.assert_close(b.k_cache, a.k_cache, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.v_cache, a.v_cache, atol=1e-5, rtol=1e-5)
    assert calls.count(False) > 0 and calls.count(True) > 0  # decodes, and verifies that keep k


def test_one_kernel_verify_attention_with_padded_trees_agrees():
    """Different committed lengths and tree sizes (varlen mode: a padded forest) through the
    one-kernel verify attention (each request reads its own tree's scratch keys under the tree
    mask) give the dense SDPA path's logits; stale values past a small tree's keys are never
    read (poisoned with NaN here)."""
    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    dense = HybridModel(spec, "cpu", torch.float32, cache_kernel=False, varlen_attention=False, **kw)
    fused = HybridModel(spec, "cpu", torch.float32, cache_kernel=True, varlen_attention=True, **kw)
    a, b = warm_cache(dense, prefix=(5, 3), max_len=24), warm_cache(fused, prefix=(5, 3), max_len=24)
    forest = pack_forest([chain_tree(2), tree([-1, 0, 0, 1, 1])])
    for c, cache in ((0, b), (1, b)):
        cache.k_cache[:, c, :, cache.kv_lens[c] + (2 if c == 0 else 5):] = float("nan")
    toks = [5, 6, 7, 8, 9, 10, 11]
    want = dense.verify(a, forest, toks, [0, 1]).logits
    got = fused.verify(b, forest, toks, [0, 1])
    assert got.batch.tree_bias is not None and got.batch.max_nodes == 5  # the padded one-kernel path
    torch.testing.assert_close(got.logits, want, atol=2e-4, rtol=2e-4)


def test_skinny_mm_path_agrees():
    """The projections through kernels.skinny_mm (a decode's 2 rows, a verify's 7) give what
    the plain GEMMs give: every linear of the step goes through it."""
    from bole_cli.kernels import skinny_mm

    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    plain = HybridModel(spec, "cpu", torch.float32, **kw)
    skinny = HybridModel(spec, "cpu", torch.float32, skinny_mm=True, **kw)
    calls = []

    def traced(x, w, **kw):
        calls.append((tuple(w.shape), kw.get("residual") is not None, kw.get("norm") is not None, bool(kw.get("glu")),
                      "gate" in kw, "head_norm" in kw))
        return skinny_mm(x, w, **kw)

    skinny._skinny = traced
    assert_step_agrees(skinny, plain, (3, 2), dict(atol=2e-4, rtol=2e-4))
    per_step = 4 * spec.layers + 1  # per layer: the mixer's in and out, the MLP's gate_up and down; LM head
    assert calls and len(calls) % per_step == 0
    # (weight, residual add fused, RMSNorm fused, SwiGLU fused, attention gate fused, GDN head
    # norm fused): the norms before the mixer's and the MLP's inputs and the LM head, the add
    # everywhere but the first layer's input; the gate before o_proj; the GDN output's gated
    # norm before out_proj in a verify (a decode's fused GDN kernel norms its output itself)
    want = {(tuple(plain.lm_head.shape), True, True, False, False, False)}
    for i, layer in enumerate(plain.layers):
        mix = layer.mixer
        if layer.kind == "gdn":
            out = tuple(mix.out_proj.shape)
            want |= {(tuple(mix.in_proj.shape), i > 0, True, False, False, False), (out, False, False, False, False, True)}
        else:
            want |= {(tuple(mix.qkv_proj.shape), i > 0, True, False, False, False),
                     (tuple(mix.o_proj.shape), False, False, False, True, False)}
        want |= {(tuple(layer.mlp.gate_up.shape), True, True, True, False, False),
                 (tuple(layer.mlp.down.shape), False, False, False, False, False)}
    assert set(calls) == want
    # no rows (a batch without nodes): the plain GEMM, as the kernel takes 1..SKINNY_MM_MAX_ROWS
    x = torch.zeros(0, spec.hidden)
    assert skinny.project(x, plain.lm_head, "lm_head").shape == (0, spec.vocab)


def test_skinny_mm_takes_only_the_named_projections():
    """skinny_mm by name: only those projections go through the kernel (the rest through
    the plain GEMMs and the compiled pieces), the step still agrees with the plain model; an
    unknown name is refused with the names that are known."""
    from bole_cli.kernels import skinny_mm
    from bole_cli.runtime.model import SKINNY_PROJECTIONS

    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    plain = HybridModel(spec, "cpu", torch.float32, **kw)
    some = HybridModel(spec, "cpu", torch.float32, skinny_mm="in_proj, lm_head", **kw)
    assert some.skinny_mm == ("in_proj", "lm_head")
    calls = []

    def traced(x, w, **kw):
        calls.append(tuple(w.shape))
        return skinny_mm(x, w, **kw)

    some._skinny = traced
    assert_step_agrees(some, plain, (3, 2), dict(atol=2e-4, rtol=2e-4))
    want = {tuple(plain.lm_head.shape)} | {tuple(l.mixer.in_proj.shape) for l in plain.layers if l.kind == "gdn"}
    assert calls and set(calls) == want
    some.skinny_mm = False
    assert some.skinny_mm == () and some._skinny is None
    some.skinny_mm = True
    assert some.skinny_mm == SKINNY_PROJECTIONS
    with pytest.raises(InputError, match="unknown projection 'mlp'.*in_proj"):
        some.skinny_mm = ["in_proj", "mlp"]


def test_skinny_mm_default_and_its_row_limit():
    """The default takes no projection through the skinny GEMM on the CPU; the CUDA default's
    projections (SKINNY_DEFAULT) at up to skinny_max_rows rows: a one-row step through the
    kernel, a two-row step through the plain GEMMs; a row limit outside the kernel's refused."""
    from bole_cli.kernels import skinny_mm
    from bole_cli.limits import SKINNY_MM_MAX_ROWS
    from bole_cli.runtime.model import SKINNY_DEFAULT

    spec = tiny_spec(layers=4)
    kw = dict(seed=0, gdn_backend="reference", compile=False)
    assert HybridModel(spec, "cpu", torch.float32, **kw).skinny_mm == ()
    plain = HybridModel(spec, "cpu", torch.float32, skinny_mm=False, **kw)
    one = HybridModel(spec, "cpu", torch.float32, skinny_mm=SKINNY_DEFAULT, skinny_max_rows=1, **kw)
    calls = []

    def traced(x, w, **kw):
        calls.append(x.shape[0])
        return skinny_mm(x, w, **kw)

    one._skinny = traced
    a, b = warm_cache(plain, prefix=(3, 2), max_len=16), warm_cache(one, prefix=(3, 2), max_len=16)
    assert calls and set(calls) == {1}  # warm_cache decodes one request a step
    calls.clear()
    torch.testing.assert_close(one.decode(b, [4], [1]), plain.decode(a, [4], [1]), atol=2e-4, rtol=2e-4)
    gdn = sum(l.kind == "gdn" for l in plain.layers)
    # the LM head; each GDN layer's in_proj and out_proj, each attention's o_proj, each down
    assert len(calls) == 1 + 2 * gdn + (len(plain.layers) - gdn) + len(plain.layers)
    calls.clear()
    torch.testing.assert_close(one.decode(b, [1, 2]), plain.decode(a, [1, 2]), atol=2e-4, rtol=2e-4)
    forest = pack_forest([tree([-1, 0, 1, 0]), chain_tree(3)])
    got = one.verify(b, forest, [5, 6, 7, 8, 9, 10, 11], [0, 1]).logits
    torch.testing.assert_close(got, plain.verify(a, forest, [5, 6, 7, 8, 9, 10, 11], [0, 1]).logits,
                               atol=2e-4, rtol=2e-4)
    assert not calls  # two rows and more: the plain GEMMs
    for bad in (0, SKINNY_MM_MAX_ROWS + 1):
        with pytest.raises(InputError, match="skinny_max_rows"):
            HybridModel(spec, "cpu", torch.float32, skinny_max_rows=bad, **kw)
        with pytest.raises(InputError, match="skinny_max_rows"):
            one.skinny_max_rows = bad
    one.skinny_mm = True  # names set later: up to the kernel's rows, as at construction
    assert one.skinny_max_rows == SKINNY_MM_MAX_ROWS
    one.skinny_mm = None  # the device's default again (none on the CPU)
    assert one.skinny_mm == () and one._skinny is None


def test_skinny_defaults_by_device_and_dtype():
    """The CUDA default with bf16 activations is SKINNY_DEFAULT at one row; anything else
    takes no projection through the skinny GEMM."""
    from bole_cli.limits import SKINNY_DEFAULT_MAX_ROWS, SKINNY_MM_MAX_ROWS
    from bole_cli.runtime.model import SKINNY_DEFAULT, skinny_defaults

    assert skinny_defaults("cuda", torch.bfloat16) == (SKINNY_DEFAULT, SKINNY_DEFAULT_MAX_ROWS) == (
        ("in_proj", "out_proj", "o_proj", "down", "lm_head"), 1)
    for dev, dt in (("cuda", torch.float16), ("cuda", torch.float32), ("cpu", torch.bfloat16)):
        assert skinny_defaults(dev, dt) == ((), SKINNY_MM_MAX_ROWS)


@pytest.mark.gpu
def test_skinny_default_on_cuda_agrees_with_cublas():
    """The CUDA bf16 default (in_proj and the LM head of one-row steps through the skinny
    GEMM, the add + RMSNorm fused) gives a batch-1 decode's logits and a drafter level's
    drafts as cuBLAS with the separate norm does, to bf16 rounding; two rows take cuBLAS."""
    from bole_cli.bench.drafter import MTPDrafter, build_layout
    from bole_cli.calibrate.acceptance import preset_rows
    from bole_cli.runtime.model import SKINNY_DEFAULT

    spec = tiny_spec(layers=4)
    kw = dict(seed=0, compile=False)
    default = HybridModel(spec, "cuda", torch.bfloat16, **kw)
    assert (default.skinny_mm, default.skinny_max_rows) == (SKINNY_DEFAULT, 1)
    plain = HybridModel(spec, "cuda", torch.bfloat16, skinny_mm=False, **kw)
    warm = warm_cache(plain, prefix=(3, 2), max_len=16)
    a, b = warm.clone(), warm.clone()
    torch.testing.assert_close(default.decode(b, [1, 2]), plain.decode(a, [1, 2]))  # cuBLAS in both
    got, want = default.decode(b, [4], [1]).float(), plain.decode(a, [4], [1]).float()
    assert float((got - want).norm() / want.norm()) < 2e-2
    lay = build_layout(4, 2, preset_rows(0.9, 4, 2))
    levels = []
    for m in (default, plain):
        head = MTPDrafter(m, lay)
        st = head.new_state(1, 12)
        st.pending.copy_(torch.tensor([3], device="cuda"))
        with torch.inference_mode():
            x1, _ = head.level(st, 0, st.pending.view(1, 1), st.hidden.view(1, 1, -1), 0)
        levels.append(x1.float())
    assert float((levels[0] - levels[1]).norm() / levels[1].norm()) < 2e-2
