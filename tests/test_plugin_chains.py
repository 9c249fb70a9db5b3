"""The plug-in on top-k 1 (chain) verifies (bole_cli/sglang/plan.py, pool.py, factors.py;
docs/design.md §6).

A chain is the tree whose parents are 0..D-2. SGLang 0.5.23 lays a chain verify out like a
tree's (request b's D tokens at b * D + i) but with no retrive_* tensors
(hybrid_linear_attn_backend.py:298, 728, 914), so the verify hook gets
retrieve_parent_token=None and the conv runs SGLang's chain conv. The equivalence scenario
replays the GDN target-verify branch for a chain with SGLang's own paths and with the
plug-in's hooks, then commits a random accepted prefix per request:

- SGLang's snapshot chain verify (intermediate_ssm + conv windows, dense or the
  deduplicated layout SGLang allocates for CUDA chains) and its accepted-snapshot scatter;
- SGLang's ReplaySSM chain verify + commit as bole_cli/sglang/baseline_kernels.py wraps them: the
  circular ring (``replayssm_ring_*``, the protocol 0.5.23 runs for GDN models; used when
  kernels.py has it) and the fold (``replayssm_verify`` / ``replayssm_fold``, KDA's
  protocol, a second baseline);
- Bole through the hooks, without snapshots.

The same run with a deliberately wrong parent in Bole's chain must fail the tolerances.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace as NS

import pytest

from bole_cli.sglang import hooks, plugin, process, sizing

from test_plugin import (_fake_configurator, _fake_configurator_module,  # noqa: F401
                         _bole_pool_case, _must_not_run, commit_checks, equivalence_rig,
                         eligible_facts, fresh_plugin_state, rel)


@pytest.fixture
def fresh_log(monkeypatch):
    monkeypatch.setattr(process, "logged", set())


def _chain_module(**spec):
    """The fake kv_cache_configurator of test_plugin, serving a top-k 1 draft."""
    ns = _fake_configurator_module()
    ns["get_spec"] = lambda: NS(**{"speculative_eagle_topk": 1, "speculative_algorithm": "EAGLE", **spec})
    return ns


def _mamba(ns, **flags):
    ex = ns["get_exec"]()
    ns["get_exec"] = lambda: NS(mamba=NS(**{**vars(ex.mamba), **flags}))


# ----------------------------------------------------------------- hooks: plan, budget, pool


@pytest.mark.parametrize("topk", [1, None])
def test_budget_and_pool_hooks_take_a_chain(topk, monkeypatch, fresh_log, caplog):
    pytest.importorskip("torch")
    monkeypatch.delenv("BOLE_CHAINS", raising=False)
    ns = _chain_module(speculative_eagle_topk=topk)
    cfg = _fake_configurator()
    plan, why = sizing.configurator_plan(cfg, ns)
    assert why == "" and plan.chain and plan.rows == 17 and plan.draft_tokens == 16
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        rest = hooks._around_handle_max_mamba_cache(ns["_handle_max_mamba_cache"], cfg, 100.0)
    assert rest == pytest.approx(100.0 - plan.arena_bytes() / (1 << 30))
    assert any("without per-node snapshots (chain verify)" in r.getMessage() for r in caplog.records)
    built = hooks._around_build_hybrid_req_pool(ns["_build_hybrid_req_pool"], cfg, max_num_reqs=16,
                                                 extra_max_context_len=0)
    assert built is not ns["MambaPool"] and built.bole_plan.chain
    assert ns["HybridReqToTokenPool"].mamba_pool_cls is ns["MambaPool"]


@pytest.mark.parametrize("env,flags,reason", [
    ({"BOLE_CHAINS": "0"}, {}, "BOLE_CHAINS='0': chains keep SGLang's path"),
    ({"BOLE_CHAINS": "nope"}, {}, "BOLE_CHAINS='nope' (use 1 or 0)"),
    ({}, {"enable_linear_replayssm_spec": True},
     "--enable-linear-replayssm-spec: SGLang's ReplaySSM verifies the chain"),
    ({"BOLE_CHAINS": "1"}, {"enable_linear_replayssm_spec": True}, "Bole stays out of the way"),
])
def test_chains_left_to_sglang_keep_its_budget_and_pool_with_one_line(env, flags, reason, monkeypatch,
                                                                      fresh_log, caplog):
    monkeypatch.delenv("BOLE_CHAINS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ns = _chain_module()
    _mamba(ns, **flags)
    cfg = _fake_configurator()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert hooks._around_handle_max_mamba_cache(ns["_handle_max_mamba_cache"], cfg, 100.0) == 90.0
        assert hooks._around_build_hybrid_req_pool(ns["_build_hybrid_req_pool"], cfg, max_num_reqs=16,
                                                    extra_max_context_len=0) is ns["MambaPool"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and reason in lines[0] and "\n" not in lines[0], lines
    # the same switch leaves trees alone
    ns["get_spec"] = lambda: NS(speculative_eagle_topk=4, speculative_algorithm="EAGLE")
    plan, why = sizing.configurator_plan(cfg, ns)
    assert (plan is None) == bool(flags) and (plan is None or not plan.chain)


def test_activation_line_says_whether_chains_are_taken(fresh_plugin_state, caplog):
    from test_plugin import FakeHookType, FakeRegistry

    from bole_cli.sglang.source import SGLANG_VERSION

    for env, words in (({}, "for trees and chains"), ({"BOLE_CHAINS": "0"}, "trees only (BOLE_CHAINS=0")):
        fresh_plugin_state.update(active=False)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
            assert plugin._activate(SGLANG_VERSION, FakeRegistry(), FakeHookType, environ=env)
        assert [words in r.getMessage() for r in caplog.records] == [True]


def test_chain_pool_on_sglangs_state_classes(sglang_source):
    """A chain plan builds Bole's pool for top-k 1 kwargs (None too); kwargs of another draft
    shape than the plan's get SGLang's pool (the fake base asserts on D when it is asked
    for snapshots, proving the pass-through)."""
    torch = pytest.importorskip("torch")
    from bole_cli.sglang import factors
    from bole_cli.sglang.pool import eligible_pool_kwargs

    L = 2
    cls, params, plan, _ = _bole_pool_case(sglang_source, torch, layers=L, draft_tokens=4, topk=1)
    assert plan.chain
    kw = dict(size=5, spec_state_size=2, cache_params=params, mamba_layer_ids=[0, 1], device="cpu",
              speculative_num_draft_tokens=4, speculative_eagle_topk=1)
    for topk in (1, None):
        pool = cls(**dict(kw, speculative_eagle_topk=topk))
        try:
            assert pool.bole_store is not None and pool.bole_store.plan.chain
            view = pool.mamba2_layer_cache(1)
            assert view.intermediate_conv_window[0] is None  # SGLang's chain conv: no window snapshots
            assert factors.lookup(view.temporal) == (pool.bole_store, 1)
        finally:
            pool.bole_store.unbind()
    with pytest.raises(AssertionError, match="must not ask"):
        cls(**dict(kw, speculative_eagle_topk=4))
    assert "plan was made for a chain" in eligible_pool_kwargs(dict(kw, speculative_eagle_topk=4), plan)
    tree = dataclasses.replace(plan, chain=False)
    assert "plan was made for a tree" in eligible_pool_kwargs(kw, tree)
    assert eligible_pool_kwargs(dict(kw, enable_linear_replayssm_spec=True), plan) == \
        "enable_linear_replayssm_spec is on"


# ----------------------------------------------------------------- drop-in equivalence


def _dedup_conv_window(torch, layers, rows, D, conv_dim, w1, dtype, device):
    """SGLang's deduplicated chain layout (memory_pool.py _allocate_deduplicated_conv_window):
    one [conv_dim, D + w1 - 1] buffer per row, step t's window its columns t..t+w1-1."""
    phys = torch.zeros(layers, rows, conv_dim, D + w1 - 1, dtype=dtype, device=device)
    return phys.as_strided((layers, rows, D, conv_dim, w1),
                           (phys.stride(0), phys.stride(1), phys.stride(3), phys.stride(2), phys.stride(3)))


def run_chain_equivalence(kern, *, device, bs, D, H, HV, K, V, layers=2, act="float32", seed=0, pad=0,
                          W=4, dedup=False, wrong_parent=None, accept=None, precision=None) -> dict:
    """SGLang's chain verify + commit (snapshots; ReplaySSM fold) vs the plug-in's; errors.
    accept: each request's accepted node (default random); wrong_parent: a node whose
    parent in Bole's chain is made i - 2 instead of i - 1 (the test that must fail)."""
    r = equivalence_rig(device=device, bs=bs, D=D, H=H, HV=HV, K=K, V=V, layers=layers, act=act, seed=seed,
                        pad=pad, W=W, precision=precision, chain=True,
                        metadata=dict(retrieve_next_token=None, retrieve_next_sibling=None,
                                      retrieve_parent_token=None))
    torch, dt, rng, rnd, split = r.torch, r.dt, r.rng, r.rnd, r.split
    n_real, n_rows, T, conv_dim = r.n_real, r.n_rows, r.T, r.conv_dim
    slots, track_slots, cu, rows = r.slots, r.track_slots, r.cu, r.rows
    temporal_s, conv_s, temporal_b, inter, store = r.temporal_s, r.conv_s, r.temporal_b, r.inter, r.store
    pool, backend, fb, gdn_ids, placeholder = r.pool, r.backend, r.fb, r.gdn_ids, r.placeholder
    temporal_r = temporal_s.clone()
    icw = (_dedup_conv_window(torch, layers, n_rows + 1, D, conv_dim, W - 1, dt, device) if dedup else
           torch.zeros(layers, n_rows + 1, D, conv_dim, W - 1, dtype=dt, device=device))
    rings = kern.replayssm_rings(temporal_r, D, H, dt)
    # The circular ring (GDN's ReplaySSM protocol), where kernels.py wraps it: ring rows are
    # request rows (SGLang: req_pool_indices), the ring dtype the conv dtype, as MambaPool.
    use_ring = callable(getattr(kern, "replayssm_ring_verify", None))
    if use_ring:
        from bole_cli.sglang.baseline_kernels import ring_len_for

        temporal_c = temporal_s.clone()
        replay = torch.arange(n_rows, dtype=torch.int32, device=device)
        ring = kern.replayssm_ring(temporal_c, n_rows + 1, H, dt, cache_len=ring_len_for(D))

    if wrong_parent is not None:  # the template the chain verify copies: node i's parent -> i - 2
        store.chain[wrong_parent] = wrong_parent - 2

    def conv(x, states, weight, window, meta):
        """gdn_backend.py's verify conv for a chain: no retrive_* links (metadata has none)."""
        return kern.causal_conv1d_update(
            x.view(n_rows, D, -1).transpose(1, 2), states, weight, None, "silu",
            conv_state_indices=meta.mamba_cache_indices[:n_rows], intermediate_conv_window=window,
            intermediate_state_indices=rows, retrieve_next_token=meta.retrieve_next_token,
            retrieve_next_sibling=meta.retrieve_next_sibling, retrieve_parent_token=meta.retrieve_parent_token,
        ).transpose(1, 2).reshape(T, -1)

    def gdn_verify_branch(self, layer, forward_batch, mixed_qkv, a, b, *, weight, A_log, dt_bias):
        """The TARGET_VERIFY branch on Bole's pool (per-layer conv window None)."""
        lid = pool.mamba2_layer_index(layer.layer_id)
        meta = self.forward_metadata
        q, k, v = split(conv(mixed_qkv, pool.mamba_pool.mamba_cache.conv[0][lid], weight, None, meta))
        return hooks._around_target_verify(
            _must_not_run, "GDNKernelDispatcher()", A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
            ssm_states=pool.mamba_pool.mamba_cache.temporal[lid], cache_indices=meta.mamba_cache_indices,
            query_start_loc=meta.query_start_loc, intermediate_states_buffer=placeholder[lid],
            intermediate_state_indices=rows, cache_steps=forward_batch.spec_info.draft_token_num,
            retrieve_parent_token=meta.retrieve_parent_token, stable_rows=False)

    out = {"o": [], "o_replayssm": [], "o_sglang_paths": [], "o_ring": [], "ring": use_ring}
    real = slice(0, n_real * D)
    try:
        for lid in range(layers):
            mixed = rnd(T, conv_dim, dtype=dt)
            weight = rnd(conv_dim, W, scale=0.5, dtype=dt)
            a, b = rnd(T, HV, dtype=dt), rnd(T, HV, dtype=dt)
            A_log, dt_bias = rnd(HV, scale=0.5), rnd(HV, dtype=dt)
            # SGLang, snapshots: its chain conv with window snapshots, its serial verify
            q, k, v = split(conv(mixed, conv_s[lid], weight, icw[lid], backend.forward_metadata))
            o_s = kern.target_verify(
                A_log, dt_bias, q, k, v, a, b, ssm_states=temporal_s[lid], cache_indices=slots,
                query_start_loc=cu, intermediate_states_buffer=inter[lid], intermediate_state_indices=rows,
                cache_steps=D, retrieve_parent_token=None)
            # SGLang, ReplaySSM: the same conv output, the ring-writing verify (state frozen)
            o_r = kern.replayssm_verify(A_log, dt_bias, q, k, v, a, b, ssm_states=temporal_r[lid],
                                        cache_indices=slots, query_start_loc=cu,
                                        rings={name: r[lid] for name, r in rings.items()})

            def original(self, layer, forward_batch, mixed_qkv, a_, b_, **kw):
                return gdn_verify_branch(self, layer, forward_batch, mixed_qkv, a_, b_, weight=weight,
                                         A_log=A_log, dt_bias=dt_bias)

            o_b = hooks._around_forward_extend(original, backend, NS(layer_id=gdn_ids[lid]), fb, mixed, a, b)
            assert o_b.shape == o_s.shape and o_b.dtype == o_s.dtype
            if use_ring:
                o_c = kern.replayssm_ring_verify(
                    A_log, dt_bias, q, k, v, a, b, checkpoint_state=temporal_c[lid],
                    ring=kern.ring_layer(ring, lid), cache_indices=slots, replay_indices=replay,
                    query_start_loc=cu, draft_token_num=D)
                out["o_ring"].append(rel(o_b[0, real], o_c.reshape(o_s.shape)[0, real]))
            out["o"].append(rel(o_b[0, real], o_s[0, real]))
            out["o_replayssm"].append(rel(o_b[0, real], o_r.reshape(o_s.shape)[0, real]))
            out["o_sglang_paths"].append(rel(o_r.reshape(o_s.shape)[0, real], o_s[0, real]))
        out["ssm_untouched_by_verify"] = torch.equal(temporal_b, temporal_s) and torch.equal(temporal_r, temporal_s)
        out["parents"] = store.parents[:T].tolist()

        # Commit: an accepted prefix per request (node a = a + 1 tokens); a track slot at a
        # step inside it, as spec_utils computes mamba_steps_to_track for chains.
        acc = list(accept) if accept is not None else [rng.randrange(D) for _ in range(n_real)]
        steps = [rng.randrange(a + 1) if rng.random() < 0.5 else -1 for a in acc]
        acc_t = torch.tensor(acc, device=device)  # int64, as spec_utils computes it
        steps_t = torch.tensor(steps, device=device)
        kern.copy_back_accepted(temporal_s, inter, slots[:n_real], acc_t)
        kern.copy_back_accepted(conv_s, icw, slots[:n_real], acc_t)
        kern.copy_back_accepted(temporal_s, inter, track_slots, steps_t)
        kern.copy_back_accepted(conv_s, icw, track_slots, steps_t)
        kern.replayssm_fold(temporal_r, rings, slots[:n_real], (acc_t + 1).to(torch.int32))
        if use_ring:  # commit, then read the state the ring holds (SGLang's materialisation)
            kern.replayssm_ring_commit(temporal_c, ring, slots[:n_real], replay[:n_real],
                                       (acc_t + 1).to(torch.int32), D)
            kern.replayssm_ring_materialize(temporal_c, ring, slots[:n_real], replay[:n_real])
        ple = []
        hybrid = NS(linear_attn_backend=backend,
                    _update_ple_state_after_mtp_verify=lambda *a_: ple.append(a_))
        hooks._around_commit(_must_not_run, hybrid, acc_t, track_slots, steps_t, None, None)
        out["ple_called"] = len(ple) == 1 and ple[0][2] is track_slots
        commit_checks(r, out, steps)
        main = slots[:n_real].tolist()
        out["state_replayssm"] = max(rel(temporal_b[:, s], temporal_r[:, s]) for s in main)
        out["state_ring"] = max(rel(temporal_b[:, s], temporal_c[:, s]) for s in main) if use_ring else None
        out["accepted"] = acc
    finally:
        store.unbind()
    return out


def _chain(D, bs, pad):
    return ([-1] + list(range(D - 1))) * (bs + pad)


@pytest.mark.parametrize("bs,D,pad,seed,dedup", [
    (3, 6, 1, 1, False), (3, 6, 1, 1, True), (2, 9, 0, 2, True), (1, 2, 1, 3, False), (2, 17, 1, 5, True)])
def test_chain_equivalence_with_sglangs_chain_paths_on_cpu(sglang_kernels, bs, D, pad, seed, dedup):
    """Bole's chain (no snapshots) against SGLang's snapshot chain verify + scatter, its
    ReplaySSM fold verify + commit and, where kernels.py wraps it, its circular ring (GDN's
    protocol), within the tree tests' tolerances; D = 9 and 17 pass the one-tile kernel's
    8-level product form. K = 32: the ring kernel needs K / 2 >= 16 for its dots."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter variant; the GPU test covers CUDA")
    res = run_chain_equivalence(sglang_kernels, device="cpu", bs=bs, D=D, H=2, HV=4, K=32, V=16, layers=2,
                                act="float32", seed=seed, pad=pad, dedup=dedup)
    assert res["parents"] == _chain(D, bs, pad)
    assert res["ssm_untouched_by_verify"]
    assert max(res["o"]) < 1e-5 and max(res["o_replayssm"]) < 1e-5, res
    assert max(res["o_sglang_paths"]) < 1e-5, res  # SGLang's two chain paths agree
    assert res["state_slots"] < 1e-5 and res["state_replayssm"] < 1e-5, res
    assert res["conv_equal"] and res["untouched_equal"] and res["ple_called"], res
    if res["ring"]:  # SGLang's circular ring (GDN's ReplaySSM), where kernels.py wraps it
        assert max(res["o_ring"]) < 1e-5 and res["state_ring"] < 1e-5, res


def test_a_wrong_parent_in_bole_chain_fails_the_equivalence(sglang_kernels):
    """The equivalence above can fail: node 3's parent set to 1 instead of 2 (every request
    accepting past it) puts Bole's outputs and committed states far outside the tolerances."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter variant")
    kw = dict(device="cpu", bs=3, D=6, H=2, HV=4, K=32, V=16, layers=2, act="float32", pad=1, seed=4,
              accept=[3, 5, 4])
    good = run_chain_equivalence(sglang_kernels, **kw)
    bad = run_chain_equivalence(sglang_kernels, wrong_parent=3, **kw)
    assert bad["parents"][3] == 1 and good["parents"][3] == 2
    assert max(good["o"]) < 1e-5 and good["state_replayssm"] < 1e-5
    assert min(bad["o"]) > 1e-2 and min(bad["o_replayssm"]) > 1e-2, bad
    assert bad["state_slots"] > 1e-2 and bad["state_replayssm"] > 1e-2, bad
    assert max(bad["o_sglang_paths"]) < 1e-5  # SGLang's side is unchanged
    if good["ring"]:
        assert max(good["o_ring"]) < 1e-5 and good["state_ring"] < 1e-5, good
        assert min(bad["o_ring"]) > 1e-2 and bad["state_ring"] > 1e-2, bad


@pytest.mark.gpu_slow
@pytest.mark.parametrize("act", ["float32", "bfloat16"])
@pytest.mark.parametrize("bs,D", [(16, 4), (8, 16), (4, 64), (1, 128)])
def test_gpu_chain_equivalence_qwen35_9b(act, bs, D):
    """Qwen3.5-9B GDN shapes, SGLang's kernels from the wheel, the deduplicated conv-window
    layout SGLang allocates for CUDA chains; within the GPU tree test's 2e-3."""
    from bole_cli.sglang.baseline_kernels import load_sglang_kernels

    res = run_chain_equivalence(load_sglang_kernels(), device="cuda", bs=bs, D=D, H=16, HV=32, K=128,
                                V=128, layers=2, act=act, seed=bs * 1000 + D, pad=1 if bs < 16 else 0,
                                dedup=True)
    print(f"\n[{act} bs={bs} D={D}] o rel {max(res['o']):.2e} (vs ReplaySSM {max(res['o_replayssm']):.2e}), "
          f"state rel {res['state_slots']:.2e} (vs fold {res['state_replayssm']:.2e})")
    assert res["ssm_untouched_by_verify"]
    assert max(res["o"]) <= 2e-3 and max(res["o_replayssm"]) <= 2e-3, res
    assert res["state_slots"] <= 2e-3 and res["state_replayssm"] <= 2e-3, res
    assert res["conv_equal"] and res["untouched_equal"] and res["ple_called"], res
    if res["ring"]:
        print(f"  vs circular ring: o rel {max(res['o_ring']):.2e}, state rel {res['state_ring']:.2e}")
        assert max(res["o_ring"]) <= 2e-3 and res["state_ring"] <= 2e-3, res
