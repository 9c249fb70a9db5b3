"""The SGLang plug-in (bole_cli/sglang/plugin.py, factors.py, pool.py, plan.py).

- Pure logic (no SGLang): the pool plan and its refusals, activation and the version
  refusal, the hooks' pass-through paths, the budget / pool-class swaps.
- Against SGLang 0.5.23's source (skipped without the wheel or an installed sglang):
  every hooked / used name and source fact; Bole's SpeculativeState on SGLang's real
  State dataclasses; drop-in equivalence with SGLang's own Triton kernels on CPU under
  TRITON_INTERPRET=1 (tests/conftest.py sets it) at tiny shapes.
- GPU (marked): the same equivalence at Qwen3.5-9B GDN shapes, batch up to 16, through
  the plug-in's hook functions, with SGLang's kernels loaded from the wheel by
  bole_cli.sglang.baseline_kernels.load_sglang_kernels() (sglang need not be installed).

Chains (top-k 1) have their own file, tests/test_plugin_chains.py. The equivalence
scenario replays SGLang's GDN target-verify branch (gdn_backend.py 987-1163) twice per layer: once with SGLang's pool (snapshots + conv windows, its verify
kernel, its scatter) and once with Bole's (the hooks, no snapshots), then commits a random
accepted node per request (and a prefix-cache track slot) and compares the pools.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import logging
import os
import random
import sys
import textwrap
import types
from types import SimpleNamespace as NS

import pytest

from bole_cli.errors import BoleError
from bole_cli.sglang import hooks, plugin, process, sizing, targets
from bole_cli.sglang.source import SGLANG_VERSION
from bole_cli.sglang.plan import BolePlan, decide, verify_precision

# ----------------------------------------------------------------- shared fixtures


def eligible_facts(**over):
    facts = dict(
        gdn=True, kda=False, draft_worker=False, algorithm="EAGLE", topk=4, draft_tokens=16,
        replayssm=False, replayssm_spec=False, unified_memory=False, page_major=False,
        disagg_mode="null", role_switch=False, npu=False, hip=False, pp_spec=False,
        conv_shapes=[(8192, 3)], temporal=(32, 128, 128), key_heads=16, layers=24,
        ssm_dtype="torch.float32", conv_dtype="torch.bfloat16", act_dtype="torch.bfloat16",
        max_batch=16, precision=None,
    )
    facts.update(over)
    return facts


# ----------------------------------------------------------------- plan


def test_plan_for_qwen35_9b_and_its_memory():
    plan, why = decide(eligible_facts())
    assert why == "" and plan is not None
    assert (plan.layers, plan.rows, plan.tokens, plan.draft_tokens) == (24, 17, 17 * 16, 16)
    # SGLang: a 2 MiB fp32 state + a 48 KiB bf16 conv window per node and layer.
    assert plan.snapshot_node_bytes_per_layer() == 32 * 128 * 128 * 4 + 8192 * 3 * 2
    # Bole: k and v (bf16), g and beta (fp32), the conv inputs (bf16) per layer ...
    assert plan.node_bytes_per_layer() == 16 * 128 * 2 + 32 * 128 * 2 + 2 * 32 * 4 + 8192 * 2
    # ... plus one layer's verify factors u and log_p (fp32), which the replay commit does not keep
    windows = 24 * 17 * 8192 * 3 * 2
    scratch = 17 * 16 * (32 * 128 * 4 + 32 * 4)
    assert plan.arena_bytes() == 24 * 17 * 16 * plan.node_bytes_per_layer() + windows + scratch + 4 * (17 * 16 + 17 + 16)
    assert plan.snapshot_bytes() == 24 * 17 * 16 * plan.snapshot_node_bytes_per_layer()
    assert 65 < plan.snapshot_bytes() / plan.arena_bytes() < 75
    from bole_cli.catalog.models import resolve_model
    from bole_cli.memory import sglang_snapshot_buffer_bytes

    # the intermediate_ssm part is memory.py's figure for the same buffer
    ssm_only = plan.layers * plan.tokens * 32 * 128 * 128 * 4
    assert ssm_only == sglang_snapshot_buffer_bytes(resolve_model("9b"), 16, 16)
    assert plan.to_dict()["saved_bytes"] == plan.snapshot_bytes() - plan.arena_bytes()


@pytest.mark.parametrize("steps,want", [(5, 5), (None, None), (0, None), (True, None), ("5", None), (40, 40)])
def test_plan_reads_the_drafters_depth(steps, want):
    plan, why = decide(eligible_facts(num_steps=steps, draft_tokens=128))
    assert why == "" and plan.draft_steps == want
    # a tree promises its steps (never more than width - 1); a chain (or a tree's dummy
    # chain run) width - 1; unknown steps: no promise
    assert plan.depth_promise(128, tree=True) == want
    assert plan.depth_promise(4, tree=True) == (None if want is None else min(want, 3))
    assert plan.depth_promise(128, tree=False) == 127
    assert plan.depth_promise(1, tree=False) == 0


@pytest.mark.parametrize("over,reason", [
    (dict(topk=1, chains="0"), "BOLE_CHAINS='0': chains keep SGLang's path"),
    (dict(topk=None, chains="off"), "BOLE_CHAINS='off'"),
    (dict(topk=1, chains="maybe"), "BOLE_CHAINS='maybe' (use 1 or 0)"),
    (dict(topk=1, replayssm_spec=True), "--enable-linear-replayssm-spec: SGLang's ReplaySSM"),
    (dict(topk=1, replayssm_spec=True, chains="0"), "--enable-linear-replayssm-spec"),
    (dict(topk=1, replayssm=True), "--enable-linear-replayssm (SGLang's ReplaySSM decode ring)"),
    (dict(topk="4"), "is not an integer"),
    (dict(topk=1, draft_tokens=None), "no --speculative-num-draft-tokens"),
    (dict(topk=1, algorithm="DSPARK"), "speculative algorithm 'DSPARK'"),
    (dict(topk=1, torch_compile=True), "--enable-torch-compile"),
    (dict(topk=1, disagg_mode="decode"), "PD disaggregation"),
    (dict(topk=1, draft_tokens=300), "at most 256"),
    (dict(algorithm="NGRAM"), "speculative algorithm 'NGRAM'"),
    (dict(gdn=False), "no Gated DeltaNet"),
    (dict(kda=True), "KDA"),
    (dict(draft_worker=True), "draft-model pool"),
    (dict(replayssm_spec=True), "ReplaySSM"),
    (dict(unified_memory=True), "unified-memory"),
    (dict(disagg_mode="decode"), "PD disaggregation"),
    (dict(pp_spec=True), "SGLANG_ENABLE_PP_SPEC"),
    (dict(ssm_dtype="float16"), "--mamba-ssm-dtype"),
    (dict(conv_shapes=[(8000, 3)]), "not a GDN q|k|v conv"),
    (dict(draft_tokens=300), "at most 256"),
    (dict(disabled=True), "BOLE_DISABLE"),
    (dict(precision="fast"), "BOLE_VERIFY_PRECISION"),
    (dict(precision="split"), "BOLE_VERIFY_PRECISION='split'"),
    (dict(temporal=None), "could not read the pool shapes"),
    (dict(torch_compile=True), "--enable-torch-compile"),
])
def test_plan_refusals_name_the_reason(over, reason):
    plan, why = decide(eligible_facts(**over))
    assert plan is None and reason in why and "\n" not in why


@pytest.mark.parametrize("topk", [1, None, 0])
@pytest.mark.parametrize("chains", [None, "", "1", "true", " ON "])
def test_chains_get_a_plan_unless_switched_off(topk, chains):
    """A top-k 1 draft (or an unset top-k: SGLang's chain) is verified by Bole like a tree,
    with the same arena; BOLE_CHAINS only matters for chains."""
    plan, why = decide(eligible_facts(topk=topk, chains=chains))
    assert why == "" and plan is not None and plan.chain and plan.mode == "chain"
    tree, _ = decide(eligible_facts(topk=4))
    assert not tree.chain and tree.mode == "tree"
    assert plan.arena_bytes() == tree.arena_bytes()  # the factors do not depend on the shape
    assert decide(eligible_facts(topk=4, chains="0"))[0] == tree  # trees ignore the switch
    assert decide(eligible_facts(topk=4, chains="maybe"))[0] == tree
    assert plan.to_dict()["mode"] == "chain"


def test_chain_snapshot_bytes_use_sglangs_deduplicated_conv_windows():
    """SGLang 0.5.23 keeps one [conv_dim, D + W - 2] conv buffer per row for CUDA chains
    (memory_pool.py _allocate_deduplicated_conv_window) and D dense windows for trees."""
    chain, _ = decide(eligible_facts(topk=1))
    tree, _ = decide(eligible_facts(topk=4))
    ssm = 24 * 17 * 16 * 32 * 128 * 128 * 4
    assert tree.snapshot_bytes() == ssm + 24 * 17 * 16 * 8192 * 3 * 2
    assert chain.snapshot_bytes() == ssm + 24 * 17 * 8192 * (16 + 3 - 1) * 2
    assert chain.saved_bytes() == chain.snapshot_bytes() - chain.arena_bytes() > 0


def test_nextn_alias_and_bf16_state_are_eligible():
    plan, _ = decide(eligible_facts(algorithm="nextn", ssm_dtype="bfloat16", precision="tf32"))
    assert plan is not None and plan.ssm_dtype == "bfloat16" and plan.precision == "tf32"
    assert decide(eligible_facts())[0].precision is None  # default: the kernels' choice, the replay commit (§9)


# ----------------------------------------------------------------- activation


class FakeRegistry:
    def __init__(self):
        self.calls = []

    def register(self, target, hook, hook_type):
        self.calls.append((target, hook, hook_type))


FakeHookType = types.SimpleNamespace(AROUND="around", REPLACE="replace")


@pytest.fixture
def fresh_plugin_state(monkeypatch):
    monkeypatch.setattr(process, "state", {"active": False, "reason": "not activated"})
    return process.state


@pytest.mark.parametrize("version", ["0.5.22", "0.6.0", None])
def test_refuses_other_sglang_versions_with_one_line(fresh_plugin_state, caplog, version):
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(version, reg, FakeHookType, environ={}) is False
    assert reg.calls == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert f"pinned to SGLang {SGLANG_VERSION}" in lines[0] and "staying inactive" in lines[0]
    assert caplog.records[0].levelno == logging.WARNING


def test_activates_on_the_pinned_version(fresh_plugin_state, caplog):
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}) is True
        assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}) is True  # idempotent
    assert [(t, k) for t, _, k in reg.calls] == [(h.target, "around") for h in plugin.HOOKS]
    assert all(fn is getattr(hooks, h.function) for (_, fn, _), h in zip(reg.calls, plugin.HOOKS))
    assert sum("active on SGLang" in r.getMessage() for r in caplog.records) == 1


def test_bole_disable_keeps_sglang_unchanged(fresh_plugin_state):
    reg = FakeRegistry()
    assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={"BOLE_DISABLE": "1"}) is False
    assert reg.calls == []


@pytest.mark.parametrize("version", ["0.5.23rc1", "0.5.23.dev1", "0.5.24.post1", "0.5.23.post"])
def test_only_post_releases_of_the_pinned_version_are_considered(fresh_plugin_state, caplog, version):
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(version, reg, FakeHookType, environ={}) is False
    assert reg.calls == [] and len(caplog.records) == 1
    assert f"found SGLang {version} but Bole is pinned" in caplog.records[0].getMessage()


def test_post_release_activates_when_its_source_checks_out(fresh_plugin_state, sglang_source, caplog):
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(f"{SGLANG_VERSION}.post1", reg, FakeHookType, environ={},
                                source=sglang_source) is True
    assert len(reg.calls) == len(plugin.HOOKS)
    assert any(f"active on SGLang {SGLANG_VERSION}.post1" in r.getMessage() for r in caplog.records)


def test_post_release_with_drifted_hooks_stays_inactive(fresh_plugin_state, tmp_path, caplog):
    root = tmp_path / "site"
    kernels = root / "sglang" / "srt" / "layers" / "attention" / "linear" / "kernels"
    kernels.mkdir(parents=True)
    (root / "sglang" / "_version.py").write_text(f"__version__ = version = '{SGLANG_VERSION}.post2'\n")
    (kernels / "gdn_triton.py").write_text("class TritonGDNKernel:\n    def target_verify(self, q):\n        pass\n")
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(f"{SGLANG_VERSION}.post2", reg, FakeHookType, environ={}, source=root) is False
    assert reg.calls == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "hook check(s) fail" in lines[0] and "\n" not in lines[0]


SCHEDULER = [("sglang.srt.plugins", "load_plugins"), ("sglang.srt.managers.scheduler", "run_scheduler_process")]
LAUNCHER = [("sglang.srt.plugins", "load_plugins"), ("__main__", "<module>")]


def test_hooks_only_where_a_scheduler_runs(fresh_plugin_state, caplog):
    assert process.process_role(SCHEDULER) == "scheduler"
    assert process.process_role(LAUNCHER) == "other"
    detokenizer = [("sglang.srt.plugins", "load_plugins"),
                   ("sglang.srt.managers.detokenizer_manager", "run_detokenizer_process")]
    assert process.process_role(detokenizer) == "other"
    assert process.process_role([("tests", "test_x")]) == "direct"
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}, frames=LAUNCHER, argv=[]) is False
    assert reg.calls == [] and fresh_plugin_state["reason"] == "no SGLang scheduler in this process"
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}, frames=SCHEDULER) is True
    assert len(reg.calls) == len(plugin.HOOKS)


def test_ray_launcher_is_detected_and_its_actors_can_load_the_plugin(fresh_plugin_state, caplog, monkeypatch):
    reg = FakeRegistry()
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}, frames=LAUNCHER,
                                argv=["sglang", "serve", "--use-ray"]) is False
        ray_engine = LAUNCHER + [("sglang.srt.ray.engine", "__init__")]
        assert plugin._activate(SGLANG_VERSION, reg, FakeHookType, environ={}, frames=ray_engine,
                                argv=[]) is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2
    assert all("worker_process_setup_hook" in r.getMessage() for r in caplog.records)
    # ray_worker_setup (Ray's worker_process_setup_hook) runs SGLang's loader in the actor,
    # which calls the entry point: the stack then marks a scheduler process.
    roles = []
    fake_plugins = types.ModuleType("sglang.srt.plugins")
    fake_plugins.load_plugins = lambda: roles.append(process.process_role())
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins", fake_plugins)
    plugin.ray_worker_setup()
    assert roles == ["scheduler"]


def test_entry_point_is_declared_in_pyproject():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    eps = data["project"]["entry-points"][plugin.ENTRY_POINT_GROUP]
    assert eps == {plugin.PLUGIN_NAME: plugin.ENTRY_POINT}
    module, fn = plugin.ENTRY_POINT.split(":")
    assert module == plugin.__name__ and callable(getattr(plugin, fn))


def test_plugin_module_imports_nothing_heavy():
    import subprocess
    import sys

    code = ("import sys, bole_cli.sglang.plugin, bole_cli.sglang.sizing, bole_cli.sglang.hooks; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','triton','sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------- hooks: pass-through


def _must_not_run(*a, **k):
    raise AssertionError("SGLang's original was called on a Bole pool")


def test_target_verify_passes_other_pools_to_sglang():
    torch = pytest.importorskip("torch")
    seen = {}

    def original(self, *args, **kwargs):
        seen.update(self=self, args=args, kwargs=kwargs)
        return "sglang"

    ssm = torch.zeros(2, 1, 1, 1)
    kw = dict(ssm_states=ssm, cache_indices="ci", query_start_loc="qsl", intermediate_states_buffer="isb",
              intermediate_state_indices="isi", cache_steps=5, retrieve_parent_token="rpt",
              stable_rows=False)
    out = hooks._around_target_verify(original, "kernel", 1, 2, 3, 4, 5, 6, 7, **kw)
    assert out == "sglang" and seen == {"self": "kernel", "args": (1, 2, 3, 4, 5, 6, 7), "kwargs": kw}
    # the dispatcher's call style: all keywords, some absent
    kw2 = dict(A_log=1, dt_bias=2, q=3, k=4, v=5, a=6, b=7, ssm_states=ssm, cache_indices="ci",
               query_start_loc="qsl")
    assert hooks._around_target_verify(original, "dispatcher", **kw2) == "sglang"
    assert seen == {"self": "dispatcher", "args": (), "kwargs": kw2}


def test_forward_extend_and_commit_pass_through_without_a_bole_pool():
    calls = []
    fb = NS(forward_mode=NS(is_target_verify=lambda: True), spec_info=NS(draft_token_num=4))
    backend = NS(req_to_token_pool=NS(mamba_pool=NS()), mis_metadata=None)
    out = hooks._around_forward_extend(lambda *a, **k: calls.append(("fe", a, k)) or "o",
                                        backend, NS(layer_id=3), fb, "mixed", "a", "b", extra=1)
    assert out == "o" and calls[-1] == ("fe", (backend, NS(layer_id=3), fb, "mixed", "a", "b"), {"extra": 1})
    hybrid = NS(linear_attn_backend=backend)
    hooks._around_commit(lambda *a: calls.append(("commit", a)), hybrid, "last", "track", "steps", "m", "rpi")
    assert calls[-1] == ("commit", (hybrid, "last", "track", "steps", "m", "rpi"))


class _FakeSchedule(NS):
    """SGLang's schedule bag: leaves plus a scoped override (runtime_context._ConfigBag)."""

    @contextlib.contextmanager
    def override(self, **kw):
        saved = {k: getattr(self, k) for k in kw}
        self.__dict__.update(kw)
        try:
            yield self
        finally:
            self.__dict__.update(saved)


def _fake_configurator_module():
    """A fake kv_cache_configurator: its globals are what the hooks read."""
    ns: dict = {}
    src = textwrap.dedent("""
        def _pd_prefill_skips_mamba_spec_state():
            return False

        def _handle_max_mamba_cache(self, total_rest_memory):
            # a stand-in; tests/test_plugin_sizing.py runs SGLang's real function
            if get_schedule().max_mamba_cache_size is None:
                get_schedule().max_mamba_cache_size = 100
            reserve = 0.0 if _pd_prefill_skips_mamba_spec_state() else 10.0
            return total_rest_memory - reserve

        def _build_hybrid_req_pool(self, *, max_num_reqs, extra_max_context_len):
            return HybridReqToTokenPool.mamba_pool_cls
    """)
    exec(compile(src, "fake_kv_cache_configurator", "exec"), ns)

    class MambaPool:
        pass

    class HybridReqToTokenPool:
        mamba_pool_cls = MambaPool

    mamba = NS(enable_linear_replayssm=False, enable_linear_replayssm_spec=False)
    schedule = _FakeSchedule(max_running_requests=16, max_mamba_cache_size=None)
    ns.update(
        HybridReqToTokenPool=HybridReqToTokenPool, MambaPool=MambaPool, _is_npu=False, _is_hip=False,
        get_spec=lambda: NS(speculative_eagle_topk=4, speculative_algorithm="EAGLE"),
        get_memory=lambda: NS(enable_unified_memory=False, enable_page_major_kv_layout=False),
        get_disagg=lambda: NS(disaggregation_mode="null", enable_pd_role_switch=False),
        get_exec=lambda: NS(mamba=mamba),
        get_schedule=lambda: schedule,
        max_speculative_num_draft_tokens=lambda: 16,
    )
    return ns


def _fake_configurator(**over):
    shape = NS(conv=[(8192, 3)], temporal=(32, 128, 128), num_k_heads_per_tp=16)
    params = NS(shape=shape, layers=list(range(24)),
                dtype=NS(temporal="torch.float32", conv="torch.bfloat16"))
    cfg = NS(mambaish_config=NS(mamba2_cache_params=params), hybrid_gdn_config=object(),
             hybrid_kda_config=None, is_draft_worker=False, spec_algorithm=NS(name="EAGLE"),
             attn_dp_size=1, model_dtype="torch.bfloat16")
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def test_budget_hook_drops_the_snapshot_reservation_only_during_the_call(caplog):
    ns = _fake_configurator_module()
    original, gate = ns["_handle_max_mamba_cache"], ns["_pd_prefill_skips_mamba_spec_state"]
    cfg = _fake_configurator()
    plan, _ = sizing.configurator_plan(cfg, ns)
    assert plan is not None and plan.rows == 17 and plan.layers == 24
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        rest = hooks._around_handle_max_mamba_cache(original, cfg, 100.0)
    assert rest == pytest.approx(100.0 - plan.arena_bytes() / (1 << 30))
    assert ns["_pd_prefill_skips_mamba_spec_state"] is gate  # restored
    assert any("without per-node snapshots" in r.getMessage() for r in caplog.records)
    # not eligible (a chain): SGLang's reservation stays
    chain = _fake_configurator(spec_algorithm=NS(name="NGRAM"))
    assert hooks._around_handle_max_mamba_cache(original, chain, 100.0) == 90.0
    # another plug-in's wrapper in between: the real module's globals are still found
    import functools

    wrapped = functools.wraps(original)(lambda *a, **k: original(*a, **k))
    assert hooks._around_handle_max_mamba_cache(wrapped, cfg, 100.0) == pytest.approx(rest)
    assert ns["_pd_prefill_skips_mamba_spec_state"] is gate


def test_pool_hook_swaps_the_pool_class_only_during_the_build():
    pytest.importorskip("torch")
    ns = _fake_configurator_module()
    original, owner = ns["_build_hybrid_req_pool"], ns["HybridReqToTokenPool"]
    built = hooks._around_build_hybrid_req_pool(original, _fake_configurator(), max_num_reqs=16,
                                                 extra_max_context_len=0)
    assert issubclass(built, ns["MambaPool"]) and built is not ns["MambaPool"]
    assert built.bole_plan.draft_tokens == 16
    assert owner.mamba_pool_cls is ns["MambaPool"]
    plain = hooks._around_build_hybrid_req_pool(
        original, _fake_configurator(hybrid_gdn_config=None), max_num_reqs=16, extra_max_context_len=0)
    assert plain is ns["MambaPool"]


def test_no_bole_pool_unless_every_hook_applied(monkeypatch, fresh_plugin_state):
    ns = _fake_configurator_module()
    registry = NS(_patched=set())
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", NS(HookRegistry=registry))
    plan, why = sizing.configurator_plan(_fake_configurator(), ns)
    assert plan is None and why == "hooks not applied: the plug-in is not active"
    fresh_plugin_state["active"] = True
    registry._patched = {h.target for h in plugin.HOOKS[1:]}
    plan, why = sizing.configurator_plan(_fake_configurator(), ns)
    assert plan is None and why == "hooks not applied: " + plugin.HOOKS[0].target
    registry._patched.add(plugin.HOOKS[0].target)
    assert sizing.configurator_plan(_fake_configurator(), ns)[0] is not None


def test_configurator_read_errors_keep_sglang_path():
    ns = _fake_configurator_module()
    plan, why = sizing.configurator_plan(NS(), ns)
    assert plan is None and why.startswith("could not read SGLang's configuration")


# ----------------------------------------------------------------- against SGLang's source


def test_every_hook_target_exists_with_its_signature_in_sglang(sglang_source):
    assert sglang_source.version == SGLANG_VERSION
    assert targets.check_plugin_targets(sglang_source) == []
    listed = {t.target: t for t in targets.SGLANG_TARGETS}
    sigs = {
        "_around_forward_extend": ("layer", "forward_batch", "mixed_qkv", "a", "b"),
        "_around_commit": ("last_correct_step_indices", "mamba_track_indices",
                           "mamba_steps_to_track", "model", "req_pool_indices"),
        "_around_handle_max_mamba_cache": ("total_rest_memory",),
    }
    import inspect

    for hook in plugin.HOOKS:
        params = listed[hook.target].params
        assert params is not None
        want = [p for p in params if p not in ("self", "*", "**kwargs")]
        if hook.function in sigs:  # the hook takes the target's parameters, in order
            mine = list(inspect.signature(getattr(hooks, hook.function)).parameters)[2:]
            assert mine[: len(sigs[hook.function])] == want[: len(sigs[hook.function])]
        if hook.function == "_around_target_verify":  # positional names it maps, then keywords
            assert tuple(want[:7]) == hooks._VERIFY_POSITIONAL
            assert {"ssm_states", "cache_indices", "query_start_loc"} <= set(want)
    verify_targets = [h.target for h in plugin.HOOKS if h.function == "_around_target_verify"]
    assert any(t.endswith("GDNKernelDispatcher.target_verify") for t in verify_targets)
    assert any(t.endswith("TritonGDNKernel.target_verify") for t in verify_targets)


def test_target_check_catches_drift(tmp_path):
    root = tmp_path / "site"
    pkg = root / "sglang"
    (pkg / "srt" / "layers" / "attention" / "linear" / "kernels").mkdir(parents=True)
    (pkg / "_version.py").write_text("__version__ = version = '0.5.99'\n")
    (pkg / "srt" / "layers" / "attention" / "linear" / "kernels" / "gdn_triton.py").write_text(
        "class TritonGDNKernel:\n    def target_verify(self, q, k, v):\n        pass\n")
    problems = targets.check_plugin_targets(root)
    assert any("TritonGDNKernel.target_verify: parameters (self, q, k, v)" in p for p in problems)
    assert any("gdn_backend.py" in p for p in problems)
    assert all("\n" not in p for p in problems)


def _sglang_state_classes(source):
    """MambaPool.State / SpeculativeState exactly as SGLang 0.5.23 defines them (with its
    get_tensor_size_bytes), compiled from the source without importing memory_pool."""
    import __future__
    import typing

    import numpy as np
    torch = pytest.importorskip("torch")

    tree = ast.parse(source.read_text("sglang/srt/mem_cache/memory_pool.py"))
    mamba = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MambaPool")
    helper = next(n for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "get_tensor_size_bytes")
    nodes = [helper] + [next(n for n in mamba.body if isinstance(n, ast.ClassDef) and n.name == name)
                        for name in ("State", "SpeculativeState")]
    glb = {"dataclass": dataclasses.dataclass, "fields": dataclasses.fields, "dataclasses": dataclasses,
           "torch": torch, "np": np, **{n: getattr(typing, n) for n in ("List", "Optional", "Tuple", "Union")}}
    code = compile(ast.Module(nodes, []), "sglang/srt/mem_cache/memory_pool.py", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, glb)
    return glb["State"], glb["SpeculativeState"]


def _fake_mamba_pool(State, SpeculativeState, torch):
    """SGLang's MambaPool.__init__ for the non-speculative layout (conv + temporal)."""

    class MambaPool:
        def __init__(self, *, size, spec_state_size, cache_params, mamba_layer_ids, device,
                     speculative_num_draft_tokens=None, speculative_eagle_topk=None, **_):
            L = len(mamba_layer_ids)
            conv = [torch.zeros((L, size + 1) + s, dtype=cache_params.dtype.conv) for s in cache_params.shape.conv]
            temporal = torch.zeros((L, size + 1) + cache_params.shape.temporal, dtype=cache_params.dtype.temporal)
            assert speculative_num_draft_tokens is None, "Bole's pool must not ask for snapshots"
            self.mamba_cache = State(conv=conv, temporal=temporal)
            self.size = size

        def mamba2_layer_cache(self, layer_id):
            return self.mamba_cache.at_layer_idx(layer_id)

    MambaPool.State, MambaPool.SpeculativeState = State, SpeculativeState
    return MambaPool


POOL_SHAPE = (2, 4, 8, 8)  # H, HV, K, V of the pool tests


def _bole_pool_case(sglang_source, torch, *, layers: int, draft_tokens: int, **facts):
    """(Bole's pool class on SGLang's real State classes over a fake MambaPool, the cache
    params SGLang would pass, the plan, those State classes): what the pool tests of trees
    and chains share."""
    from bole_cli.sglang.pool import bole_pool_class

    State, SpeculativeState = _sglang_state_classes(sglang_source)
    base = _fake_mamba_pool(State, SpeculativeState, torch)
    H, HV, K, V = POOL_SHAPE
    conv_dim = 2 * H * K + HV * V
    params = NS(shape=NS(conv=[(conv_dim, 3)], temporal=(HV, V, K)),
                dtype=NS(conv=torch.float32, temporal=torch.float32))
    plan, _ = decide(eligible_facts(conv_shapes=[(conv_dim, 3)], temporal=(HV, V, K), key_heads=H,
                                    layers=layers, draft_tokens=draft_tokens, max_batch=2,
                                    act_dtype="float32", conv_dtype="float32", **facts))
    return bole_pool_class(base, plan), params, plan, (State, SpeculativeState)


def test_bole_pool_on_sglangs_state_classes(sglang_source):
    torch = pytest.importorskip("torch")
    from bole_cli.sglang import factors

    H, HV, K, V, L = POOL_SHAPE[:4] + (3,)
    cls, params, plan, (State, SpeculativeState) = _bole_pool_case(sglang_source, torch, layers=L,
                                                                   draft_tokens=5)
    kw = dict(size=6, spec_state_size=3, cache_params=params, mamba_layer_ids=[0, 1, 2], device="cpu",
              speculative_num_draft_tokens=5, speculative_eagle_topk=4)
    pool = cls(**kw)
    try:
        cache = pool.mamba_cache
        assert isinstance(cache, SpeculativeState)
        assert cache.intermediate_ssm.shape == (L, 4, 5, HV, V, K)
        assert cache.intermediate_ssm.untyped_storage().nbytes() == 4  # a placeholder, no memory
        view = pool.mamba2_layer_cache(1)  # what GDNAttnBackend.forward_extend reads
        assert isinstance(view, SpeculativeState) and view.intermediate_ssm is not None
        assert view.intermediate_conv_window[0] is None  # -> SAVE_INTERMEDIATE=False
        assert view.temporal.data_ptr() == cache.temporal[1].data_ptr()
        assert factors.lookup(view.temporal) == (pool.bole_store, 1)
        real = sum(t.numel() * t.element_size() for t in (*cache.conv, cache.temporal))
        assert cache.mem_usage_bytes() == real
        assert pool.mem_usage == pytest.approx((real + pool.bole_store.nbytes) / (1 << 30))
        assert pool.bole_store.plan.rows == 4 and pool.bole_store.plan.layers == L
        # a chain keeps SGLang's pool (here: the fake base asserts on D, proving the pass-through)
        with pytest.raises(AssertionError, match="must not ask"):
            cls(**dict(kw, speculative_eagle_topk=1))
    finally:
        pool.bole_store.unbind()


# ----------------------------------------------------------------- drop-in equivalence


def _random_trees(rng: random.Random, bs: int, D: int) -> list[list[int]]:
    trees = []
    for _ in range(bs):
        par = [-1]
        for i in range(1, D):
            par.append(i - 1 if rng.random() < 0.5 else rng.randrange(i))
        trees.append(par)
    return trees


def _links(par):
    """SGLang's first-child / next-sibling arrays for a tree (bole_cli.trees' converter)."""
    from bole_cli.trees import ProposalTree, to_sglang

    arrays = to_sglang(ProposalTree(par, [0.0] * len(par)))
    return list(arrays.retrive_next_token), list(arrays.retrive_next_sibling)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    assert bool(a.isfinite().all()), "non-finite values"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def equivalence_rig(*, device, bs, D, H, HV, K, V, layers, act, seed, pad, W, precision, chain=False,
                    metadata=None) -> NS:
    """What the tree and chain equivalence runs share: slots (graph pads -1, track slots
    apart), SGLang's and Bole's copies of the states, SGLang's snapshot buffer, the plan and
    arena, the pool and backend namespaces the hooks read, and the q/k/v split. metadata:
    extra forward_metadata fields (a chain's empty retrive_* links)."""
    import torch

    from bole_cli.sglang.factors import FactorStore

    r = NS(torch=torch, dt={"float32": torch.float32, "bfloat16": torch.bfloat16}[act], rng=random.Random(seed))
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    r.rnd = rnd
    r.n_real, r.n_rows = bs, bs + pad
    r.T, r.conv_dim = r.n_rows * D, 2 * H * K + HV * V
    r.S = r.n_rows + bs + 3  # main slots, track slots, spare
    perm = torch.randperm(r.S, generator=gen).tolist()
    r.slots = torch.tensor(perm[:bs] + [-1] * pad, dtype=torch.int32, device=device)  # -1: graph pad
    # prefix-cache track slots are int64 in SGLang (schedule_batch.py: mamba_track_indices)
    r.track_slots = torch.tensor(perm[bs:2 * bs], dtype=torch.int64, device=device)
    r.cu = torch.tensor([min(b, bs) * D for b in range(r.n_rows + 1)], dtype=torch.int32, device=device)
    r.rows = torch.arange(r.n_rows, dtype=torch.int32, device=device)  # scratch row = batch position
    r.temporal_s = rnd(layers, r.S, HV, V, K, scale=0.3)
    r.conv_s = rnd(layers, r.S, r.conv_dim, W - 1, dtype=r.dt)
    r.temporal_b, r.conv_b = r.temporal_s.clone(), r.conv_s.clone()
    r.inter = torch.zeros(layers, r.n_rows + 1, D, HV, V, K, device=device)  # SGLang's snapshots
    r.plan = BolePlan(layers=layers, key_heads=H, key_dim=K, value_heads=HV, value_dim=V,
                      conv_dim=r.conv_dim, conv_window=W - 1, draft_tokens=D, rows=r.n_rows + 1,
                      act_dtype=act, conv_dtype=act, ssm_dtype="float32", chain=chain,
                      precision=verify_precision(precision or os.environ.get("BOLE_VERIFY_PRECISION")))
    r.store = FactorStore(r.plan, device).bind(r.temporal_b)
    r.placeholder = torch.zeros(1, device=device).expand(layers, r.n_rows + 1, D, HV, V, K)
    # Qwen3.5's layout: every 4th model layer is full attention and has no mamba state, so
    # the pool index of a GDN layer is its position among the GDN layers
    # (memory_pool.py:1463 mamba_map, 1667 mamba2_layer_index); start past layer 3.
    r.gdn_ids = [i for i in range(2, 8 * layers + 2) if i % 4 != 3][:layers]
    mamba_map = {layer_id: i for i, layer_id in enumerate(r.gdn_ids)}
    r.pool = NS(mamba_pool=NS(bole_store=r.store, mamba_cache=NS(conv=[r.conv_b], temporal=r.temporal_b)),
                mamba2_layer_index=mamba_map.__getitem__)
    r.backend = NS(req_to_token_pool=r.pool, mis_metadata=None,
                   forward_metadata=NS(mamba_cache_indices=r.slots, query_start_loc=r.cu, **(metadata or {})),
                   _translate_mamba_indices=lambda x: x)
    r.fb = NS(forward_mode=NS(is_target_verify=lambda: True), spec_info=NS(draft_token_num=D))

    def split(y):
        q, k, v = torch.split(y, [H * K, H * K, HV * V], dim=-1)  # strided views, as SGLang
        return q.view(1, r.T, H, K), k.view(1, r.T, H, K), v.view(1, r.T, HV, V)

    r.split = split
    return r


def commit_checks(r, out: dict, steps: list[int]) -> set:
    """After both commits: the touched slots' state error, every other slot untouched, the
    conv windows equal; returns the touched slots."""
    torch = r.torch
    touched = set(r.slots[:r.n_real].tolist()) | {s for s, st in zip(r.track_slots.tolist(), steps) if st >= 0}
    out["state_slots"] = max(rel(r.temporal_b[:, s], r.temporal_s[:, s]) for s in touched)
    out["untouched_equal"] = all(torch.equal(r.temporal_b[:, s], r.temporal_s[:, s])
                                 and torch.equal(r.conv_b[:, s], r.conv_s[:, s])
                                 for s in range(r.S) if s not in touched)
    out["conv_equal"] = torch.equal(r.conv_b, r.conv_s)
    out["tracked"] = sum(st >= 0 for st in steps)
    return touched


def run_equivalence(kern, *, device, bs, D, H, HV, K, V, layers=2, act="float32", seed=0, pad=0,
                    W=4, precision=None) -> dict:
    """SGLang's GDN target verify + commit vs the plug-in's, same inputs; error metrics."""
    r = equivalence_rig(device=device, bs=bs, D=D, H=H, HV=HV, K=K, V=V, layers=layers, act=act, seed=seed,
                        pad=pad, W=W, precision=precision)
    torch, dt, rng, rnd, split = r.torch, r.dt, r.rng, r.rnd, r.split
    n_real, n_rows, T, conv_dim = r.n_real, r.n_rows, r.T, r.conv_dim
    slots, track_slots, cu, rows = r.slots, r.track_slots, r.cu, r.rows
    temporal_s, conv_s, temporal_b, inter, store = r.temporal_s, r.conv_s, r.temporal_b, r.inter, r.store
    pool, backend, fb, gdn_ids, placeholder = r.pool, r.backend, r.fb, r.gdn_ids, r.placeholder
    trees = _random_trees(rng, n_rows, D)
    nt = torch.tensor([_links(p)[0] for p in trees], device=device)  # int64 like eagle_utils
    ns = torch.tensor([_links(p)[1] for p in trees], device=device)
    icw = torch.zeros(layers, n_rows + 1, D, conv_dim, W - 1, dtype=dt, device=device)

    def gdn_verify_branch(self, layer, forward_batch, mixed_qkv, a, b, *, weight, A_log, dt_bias):
        """gdn_backend.py's TARGET_VERIFY branch on Bole's pool (per-layer conv window None)."""
        lid = pool.mamba2_layer_index(layer.layer_id)
        meta = self.forward_metadata
        rpt = torch.empty_like(nt)
        y = kern.causal_conv1d_update(
            mixed_qkv.view(n_rows, D, -1).transpose(1, 2), pool.mamba_pool.mamba_cache.conv[0][lid],
            weight, None, "silu", conv_state_indices=meta.mamba_cache_indices[:n_rows],
            intermediate_conv_window=None, intermediate_state_indices=rows,
            retrieve_next_token=nt, retrieve_next_sibling=ns, retrieve_parent_token=rpt,
        ).transpose(1, 2).reshape(T, -1)
        q, k, v = split(y)
        return hooks._around_target_verify(
            _must_not_run, "TritonGDNKernel()", A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
            ssm_states=pool.mamba_pool.mamba_cache.temporal[lid], cache_indices=meta.mamba_cache_indices,
            query_start_loc=meta.query_start_loc, intermediate_states_buffer=placeholder[lid],
            intermediate_state_indices=rows, cache_steps=D, retrieve_parent_token=rpt, stable_rows=False)

    out = {"o": [], "o_maxabs": []}
    real = slice(0, n_real * D)
    try:
        for lid in range(layers):
            mixed = rnd(T, conv_dim, dtype=dt)
            weight = rnd(conv_dim, W, scale=0.5, dtype=dt)
            a, b = rnd(T, HV, dtype=dt), rnd(T, HV, dtype=dt)
            A_log, dt_bias = rnd(HV, scale=0.5), rnd(HV, dtype=dt)
            # SGLang: tree conv with window snapshots, then its serial verify with snapshots
            rpt = torch.empty_like(nt)
            y = kern.causal_conv1d_update(
                mixed.view(n_rows, D, -1).transpose(1, 2), conv_s[lid], weight, None, "silu",
                conv_state_indices=slots, intermediate_conv_window=icw[lid], intermediate_state_indices=rows,
                retrieve_next_token=nt, retrieve_next_sibling=ns, retrieve_parent_token=rpt,
            ).transpose(1, 2).reshape(T, -1)
            q, k, v = split(y)
            o_s = kern.target_verify(
                A_log, dt_bias, q, k, v, a, b, ssm_states=temporal_s[lid], cache_indices=slots,
                query_start_loc=cu, intermediate_states_buffer=inter[lid], intermediate_state_indices=rows,
                cache_steps=D, retrieve_parent_token=rpt)
            # Bole: the same branch through the plug-in's hooks
            def original(self, layer, forward_batch, mixed_qkv, a_, b_, **kw):
                return gdn_verify_branch(self, layer, forward_batch, mixed_qkv, a_, b_, weight=weight,
                                         A_log=A_log, dt_bias=dt_bias)

            o_b = hooks._around_forward_extend(original, backend, NS(layer_id=gdn_ids[lid]), fb, mixed, a, b)
            assert o_b.shape == o_s.shape and o_b.dtype == o_s.dtype
            out["o"].append(rel(o_b[0, real], o_s[0, real]))
            out["o_maxabs"].append(((o_b[0, real].double() - o_s[0, real].double()).abs().max()
                                    / o_s[0, real].double().abs().max()).item())
        out["ssm_untouched_by_verify"] = torch.equal(temporal_b, temporal_s)

        # Commit a random accepted node per request; a track slot at an accepted ancestor.
        acc, steps = [], []
        for b_ in range(n_real):
            node = rng.randrange(D)
            path = [node]
            while trees[b_][path[-1]] >= 0:
                path.append(trees[b_][path[-1]])
            acc.append(node)
            steps.append(rng.choice(path) if rng.random() < 0.5 else -1)
        acc_t = torch.tensor(acc, device=device)  # int64, as spec_utils computes it
        steps_t = torch.tensor(steps, device=device)
        kern.copy_back_accepted(temporal_s, inter, slots[:n_real], acc_t)
        kern.copy_back_accepted(conv_s, icw, slots[:n_real], acc_t)
        kern.copy_back_accepted(temporal_s, inter, track_slots, steps_t)
        kern.copy_back_accepted(conv_s, icw, track_slots, steps_t)
        ple = []
        hybrid = NS(linear_attn_backend=backend,
                    _update_ple_state_after_mtp_verify=lambda *a_: ple.append(a_))
        hooks._around_commit(_must_not_run, hybrid, acc_t, track_slots, steps_t, None, None)
        out["ple_called"] = len(ple) == 1 and ple[0][2] is track_slots and ple[0][4] is None
        out["state"] = rel(temporal_b, temporal_s)
        commit_checks(r, out, steps)
        out["arena_bytes"] = store.nbytes
        out["snapshot_bytes"] = (inter.numel() * inter.element_size() + icw.numel() * icw.element_size())
    finally:
        store.unbind()
    return out


def test_equivalence_with_sglang_kernels_on_cpu(sglang_kernels):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter variant; the GPU test covers CUDA")
    res = run_equivalence(sglang_kernels, device="cpu", bs=3, D=6, H=2, HV=4, K=16, V=16, layers=2,
                          act="float32", seed=1, pad=1)
    assert res["ssm_untouched_by_verify"]
    assert max(res["o"]) < 1e-5, res
    assert res["state"] < 1e-5 and res["state_slots"] < 1e-5, res
    assert res["conv_equal"] and res["untouched_equal"] and res["ple_called"], res
    assert res["tracked"] >= 1


def small_plan(H, HV, K, V, D, bs, **over) -> BolePlan:
    """A float32 plan for the FactorStore tests: one layer, bs requests of D tokens."""
    return BolePlan(layers=1, key_heads=H, key_dim=K, value_heads=HV, value_dim=V,
                    conv_dim=2 * H * K + HV * V, conv_window=3, draft_tokens=D, rows=bs + 1,
                    act_dtype="float32", conv_dtype="float32", ssm_dtype="float32", **over)


def verify_inputs(torch, gen, H, HV, K, V, T):
    """target_verify's random A_log, dt_bias, q, k, v, a, b for T tokens (SGLang's shapes)."""
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    a, b = torch.randn(T, HV, generator=gen), torch.randn(T, HV, generator=gen)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    return A_log, dt_bias, q, k, v, a, b


def test_verify_of_chains_without_parent_table():
    """SGLang's dummy runs verify with retrieve_parent_token None: Bole treats chains."""
    torch = pytest.importorskip("torch")
    from bole_cli.kernels.reference import gdn_gates_ref, tree_verify_sequential_ref
    from bole_cli.sglang.factors import FactorStore

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    H, HV, K, V, D, bs = 1, 2, 8, 8, 4, 2
    plan = small_plan(H, HV, K, V, D, bs)
    gen = torch.Generator().manual_seed(3)
    temporal = (torch.randn(1, 4, HV, V, K, generator=gen) * 0.3).to(dev)
    store = FactorStore(plan, dev).bind(temporal)
    try:
        T = bs * D
        A_log, dt_bias, q, k, v, a, b = verify_inputs(torch, gen, H, HV, K, V, T)
        slots = torch.tensor([2, 0], dtype=torch.int32)
        cu = torch.arange(0, T + 1, D, dtype=torch.int32)
        on = [x.to(dev) for x in (A_log, dt_bias, q, k, v, a, b)]
        o = store.verify(0, *on, ssm_states=temporal[0], cache_indices=slots.to(dev),
                         query_start_loc=cu.to(dev), retrieve_parent_token=None, draft_token_num=D)
        g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
        chain = torch.tensor([-1, 0, 1, 2] * bs, dtype=torch.int32)
        want, _ = tree_verify_sequential_ref(q[0], k[0], v[0], g, beta, temporal[0].cpu(), slots, chain, cu)
        assert rel(o[0].cpu(), want) < (1e-5 if dev == "cpu" else 1e-4)
        assert store.parents[:T].tolist() == chain.tolist()
    finally:
        store.unbind()


@pytest.mark.parametrize("steps", [None, 3])
def test_big_shallow_trees_verify_level_by_level_with_the_drafters_depth(steps, monkeypatch):
    """Past one tile, a tree plan promises --speculative-num-steps as the verify's depth, so
    a small batch takes the level kernel (and no chain kernel); no steps known: the blocked
    kernel. Both exact."""
    torch = pytest.importorskip("torch")
    from test_kernels import LaunchSpy

    from bole_cli.kernels.reference import gdn_gates_ref, tree_verify_sequential_ref
    from bole_cli.sglang.factors import FactorStore
    from bole_cli.trees import random_tree

    H, HV, K, V, D, bs = 1, 2, 16, 16, 72, 2
    plan = small_plan(H, HV, K, V, D, bs, draft_steps=steps)
    gen = torch.Generator().manual_seed(5)
    r = random.Random(5)
    trees = [random_tree(r, D, max_depth=3) for _ in range(bs)]
    # within the promise (depth counts nodes, the promise strict ancestors): SGLang's trees
    # are at most num_steps deep
    assert 3 <= max(t.depth for t in trees) <= 4
    local = [list(t.parents) for t in trees]
    rpt = torch.tensor([[0] + p[1:] for p in local], dtype=torch.int64)
    temporal = torch.randn(1, 4, HV, V, K, generator=gen) * 0.3
    store = FactorStore(plan, "cpu").bind(temporal)
    try:
        T = bs * D
        A_log, dt_bias, q, k, v, a, b = verify_inputs(torch, gen, H, HV, K, V, T)
        slots = torch.tensor([3, 1], dtype=torch.int32)
        cu = torch.arange(0, T + 1, D, dtype=torch.int32)
        spy = LaunchSpy(monkeypatch)
        o = store.verify(0, A_log, dt_bias, q, k, v, a, b, ssm_states=temporal[0], cache_indices=slots,
                         query_start_loc=cu, retrieve_parent_token=rpt, draft_token_num=D)
        assert spy.take() == (["levels"] if steps else ["chain", "blocked"])
        g, beta = gdn_gates_ref(A_log, a, dt_bias, b)
        parents = torch.tensor(sum(local, []), dtype=torch.int32)
        want, _ = tree_verify_sequential_ref(q[0], k[0], v[0], g, beta, temporal[0], slots, parents, cu)
        assert rel(o[0], want) < 1e-5
    finally:
        store.unbind()


def test_torch_compile_keeps_sglangs_path_and_never_traces_the_lookup(monkeypatch):
    torch = pytest.importorskip("torch")
    from bole_cli.sglang import factors

    ns = _fake_configurator_module()
    ex = ns["get_exec"]()
    ns["get_exec"] = lambda: NS(mamba=ex.mamba, graph=NS(enable_torch_compile=True))
    plan, why = sizing.configurator_plan(_fake_configurator(), ns)
    assert plan is None and "--enable-torch-compile" in why
    # a Bole pool present and dynamo tracing a verify: a clear error, not a data_ptr() trace
    plan = BolePlan(layers=1, key_heads=1, key_dim=8, value_heads=1, value_dim=8, conv_dim=24,
                    conv_window=3, draft_tokens=4, rows=2, act_dtype="float32", conv_dtype="float32",
                    ssm_dtype="float32")
    temporal = torch.zeros(1, 3, 1, 8, 8)
    store = factors.FactorStore(plan, "cpu").bind(temporal)
    try:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        with pytest.raises(BoleError, match="enable-torch-compile"):
            factors.lookup(temporal[0])
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
        assert factors.lookup(temporal[0]) == (store, 0)
    finally:
        store.unbind()
    assert factors.lookup(temporal[0]) is None  # no Bole pool: returns before any tensor call


def test_registry_forgets_a_dead_pool():
    torch = pytest.importorskip("torch")
    import gc

    from bole_cli.sglang import factors

    plan = BolePlan(layers=2, key_heads=1, key_dim=8, value_heads=1, value_dim=8, conv_dim=24,
                    conv_window=3, draft_tokens=4, rows=2, act_dtype="float32", conv_dtype="float32",
                    ssm_dtype="float32")
    temporal = torch.zeros(2, 3, 1, 8, 8)
    store = factors.FactorStore(plan, "cpu").bind(temporal)
    view = temporal[1]
    assert factors.lookup(view) == (store, 1)
    assert factors.lookup(torch.zeros(3, 1, 8, 8)) is None
    ptr = view.data_ptr()
    del temporal, view
    gc.collect()
    fake = NS(data_ptr=lambda: ptr)
    assert factors.lookup(fake) is None  # not a tensor
    assert ptr in factors._REGISTRY  # still registered: a new tensor at that address is not Bole's
    probe = torch.zeros(1)
    probe.data_ptr = lambda: ptr  # type: ignore[method-assign]
    assert factors.lookup(probe) is None
    assert ptr not in factors._REGISTRY


def test_arena_overflow_is_a_clear_error():
    torch = pytest.importorskip("torch")
    from bole_cli.sglang.factors import FactorStore

    plan = BolePlan(layers=1, key_heads=1, key_dim=8, value_heads=1, value_dim=8, conv_dim=24,
                    conv_window=3, draft_tokens=4, rows=2, act_dtype="float32", conv_dtype="float32",
                    ssm_dtype="float32")
    store = FactorStore(plan, "cpu")
    with pytest.raises(BoleError, match="exceeds the factor arena"):
        store.capture_conv(0, torch.zeros(12, 24), torch.zeros(4, 24, 3),
                           torch.zeros(3, dtype=torch.int32), 4)


# ----------------------------------------------------------------- GPU


@pytest.mark.gpu_slow
@pytest.mark.parametrize("act", ["float32", "bfloat16"])
@pytest.mark.parametrize("bs,D", [(16, 16), (4, 64), (1, 128)])
def test_gpu_drop_in_equivalence_qwen35_9b(act, bs, D):
    """Qwen3.5-9B GDN shapes (H 16, HV 32, K = V 128, conv 8192), 2 layers, SGLang's kernels
    from the wheel, at the served default (docs/design.md §9): the committed states within
    1e-5 of SGLang's (float32-exact), the outputs within 2e-3 (float32 activations) or 3e-3
    (bf16: each side is rounded to bf16, 1.65e-3 alone, and the verify's tf32 dots land at
    1.03-1.5x that floor; experiments/README.md row P-1)."""
    from bole_cli.sglang.baseline_kernels import load_sglang_kernels

    kern = load_sglang_kernels()  # installed sglang, $BOLE_SGLANG_WHEEL or .whl/
    res = run_equivalence(kern, device="cuda", bs=bs, D=D, H=16, HV=32, K=128, V=128, layers=2,
                          act=act, seed=bs * 1000 + D, pad=1 if bs < 16 else 0)
    print(f"\n[{act} bs={bs} D={D}] o rel {max(res['o']):.2e} (max-abs rel {max(res['o_maxabs']):.2e}), "
          f"state rel {res['state_slots']:.2e}, arena {res['arena_bytes'] / 2**20:.1f} MiB vs "
          f"snapshots {res['snapshot_bytes'] / 2**20:.1f} MiB")
    assert res["ssm_untouched_by_verify"]
    assert max(res["o"]) <= (3e-3 if act == "bfloat16" else 2e-3), res
    assert res["state_slots"] <= 1e-5, res
    assert res["conv_equal"] and res["untouched_equal"] and res["ple_called"], res


@pytest.mark.gpu_slow
def test_gpu_tf32x3_opt_in():
    """BOLE_VERIFY_PRECISION=tf32x3 (the opt-in): bf16 outputs agree with SGLang's to about
    its own rounding, the committed state float32-exact as at the default."""
    from bole_cli.sglang.baseline_kernels import load_sglang_kernels

    res = run_equivalence(load_sglang_kernels(), device="cuda", bs=16, D=16, H=16, HV=32, K=128,
                          V=128, layers=2, act="bfloat16", seed=5, precision="tf32x3")
    print(f"\n[bfloat16 tf32x3] o rel {max(res['o']):.2e}, state rel {res['state_slots']:.2e}")
    assert max(res["o"]) <= 2e-3 and res["state_slots"] <= 1e-5, res
    assert res["conv_equal"] and res["untouched_equal"], res

