"""The plug-in's memory budget and arena rows, on SGLang 0.5.23's own sizing code.

SGLang's functions are compiled from the wheel (or an installed sglang) with stubbed
globals (tests/sglang_stubs.py), and the plug-in's hooks are applied by SGLang's real
``HookRegistry`` (srt/plugins/hook_registry.py), as in a scheduler process:

- ``KVCacheConfigurator._handle_max_mamba_cache`` over batch sizes, draft tokens, mamba
  ratios and its three branches: the KV cache the plug-in leaves is SGLang's plus the
  snapshot reservation SGLang made minus the factor arena, with SGLang's mamba slot count.
- CUDA-graph capture buckets (``get_batch_sizes_to_capture`` with
  ``get_cuda_graph_batch_size_alignment``) and eager padding over two-batch overlap,
  attention TP / gathering, context parallelism: never larger than the arena.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from types import SimpleNamespace as NS

import pytest

from bole_cli.memory import format_bytes
from bole_cli.sglang import hooks, plugin, process, sizing
from bole_cli.sglang.source import SGLANG_VERSION

from sglang_stubs import install_modules, sglang_defs

GIB = 1 << 30
KVC = "sglang/srt/mem_cache/kv_cache_configurator.py"


@pytest.fixture(scope="module")
def source(sglang_source):
    return sglang_source


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(process, "state", {"active": False, "reason": "not activated"})
    monkeypatch.setattr(process, "logged", set())


# ----------------------------------------------------------------- SGLang's code, stubbed


def config_bag_class(source):
    """runtime_context._ConfigBag, SGLang's resolved-config namespace with scoped override."""
    return sglang_defs(source, "sglang/srt/runtime_context.py", ["_ConfigBag"],
                       {"contextmanager": contextlib.contextmanager, "Any": object})["_ConfigBag"]


def bag(cls, path, **leaves):
    b = cls(path)
    for k, v in leaves.items():
        b._set(k, v)
    return b


def configurator_namespace(source):
    """kv_cache_configurator's globals: SGLang's own sizing functions and constants, with
    stand-ins for the runtime context accessors (filled per scenario by `configure`)."""
    g: dict = {"__name__": "sglang.srt.mem_cache.kv_cache_configurator", "math": math,
               "logger": logging.getLogger("stub.kv_cache_configurator"), "_is_npu": False,
               "_is_hip": False, "get_pp_indices": None,
               "envs": NS(SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=NS(get=lambda: False))}
    sglang_defs(source, KVC, [
        "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO", "MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP",
        "MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER", "_pd_prefill_skips_mamba_spec_state",
        "KVCacheConfigurator._handle_max_mamba_cache", "KVCacheConfigurator._calculate_mamba_ratio",
    ], g)
    sglang_defs(source, "sglang/srt/mem_cache/allocation_sizing.py", ["get_mamba_tracking_slots"], g)
    sglang_defs(source, "sglang/srt/runtime_context.py", ["max_speculative_num_draft_tokens"], g)
    g["_ConfigBag"] = config_bag_class(source)
    return g


# Qwen3.5-9B's GDN state per TP shard (24 GDN layers, H 16, HV 32, K = V 128, conv 8192 x 3).
QWEN35_9B = dict(layers=24, key_heads=16, hv=32, v=128, k=128, conv_dim=8192, window=3)


def per_req_bytes(m, ssm_bytes=4, conv_bytes=2):
    """mamba2_cache_params.mamba_cache_per_req (srt/configs/mamba_utils.py:115-125)."""
    return (m["conv_dim"] * m["window"] * conv_bytes + m["hv"] * m["v"] * m["k"] * ssm_bytes) * m["layers"]


def configure(g, *, reqs, draft_tokens, ratio, branch, dp=1, explicit_slots=300, model=QWEN35_9B,
              topk=4, replayssm_spec=False):
    """Set the globals for one scenario; returns a KVCacheConfigurator stand-in.

    topk: 4 (a tree) or 1 (a chain); replayssm_spec: --enable-linear-replayssm-spec (its
    ring bytes per request: replayssm_ring_bytes_per_req, a stand-in figure).

    ratio: SGLang's mamba ratio (_calculate_mamba_ratio): 3 without the extra buffer, 4
    with it and no overlap, 5 with it and the overlap scheduler (SGLang's default with the
    radix cache). branch: "ratio" (SGLang's default sizing), "explicit"
    (--max-mamba-cache-size), "no_radix" (--disable-radix-cache)."""
    import torch

    extra, overlap = {3: (False, True), 4: (True, False), 5: (True, True)}[ratio]
    Bag = g["_ConfigBag"]
    g["get_schedule"] = (lambda s: lambda: s)(bag(
        Bag, "schedule", max_running_requests=reqs * dp, mamba_full_memory_ratio=0.9,
        max_mamba_cache_size=explicit_slots * dp if branch == "explicit" else None,
        disable_overlap_schedule=not overlap))
    g["get_spec"] = lambda: NS(speculative_num_draft_tokens=draft_tokens, speculative_eagle_topk=topk,
                               speculative_algorithm="EAGLE", max_speculative_num_draft_tokens=None)
    g["get_exec"] = lambda: NS(mamba=NS(enable_linear_replayssm=False,
                                        enable_linear_replayssm_spec=replayssm_spec,
                                        linear_replayssm_cache_len=16, enable_mamba_extra_buffer=extra,
                                        enable_mamba_extra_buffer_lazy=False),
                               graph=NS(enable_torch_compile=False))
    g["get_memory"] = lambda: NS(disable_radix_cache=branch == "no_radix", enable_unified_memory=False,
                                 enable_page_major_kv_layout=False)
    g["get_disagg"] = lambda: NS(disaggregation_mode="null", enable_pd_role_switch=False)
    schedule = g["get_schedule"]()
    g["get_context"] = lambda: NS(override=lambda source, **f: [schedule._set(k, v) for k, v in f.items()])
    m = model
    params = NS(layers=list(range(m["layers"])), mamba_cache_per_req=per_req_bytes(m),
                replayssm_ring_bytes_per_req=lambda record_len: record_len * per_req_bytes(m) // 64,
                shape=NS(conv=[(m["conv_dim"], m["window"])], temporal=(m["hv"], m["v"], m["k"]),
                         num_k_heads_per_tp=m["key_heads"]),
                dtype=NS(temporal=torch.float32, conv=torch.bfloat16))
    cls = g.get("KVCacheConfigurator") or type("KVCacheConfigurator", (), {
        "_handle_max_mamba_cache": g["_handle_max_mamba_cache"],
        "_calculate_mamba_ratio": g["_calculate_mamba_ratio"]})
    cfg = cls.__new__(cls)
    cfg.__dict__.update(
        mambaish_config=NS(mamba2_cache_params=params), pp_size=1, model_config=None,
        fused_entry_bytes=lambda kind: None, spec_algorithm=NS(is_none=lambda: False, name="EAGLE"),
        hybrid_gdn_config=object(), hybrid_kda_config=None, attn_dp_size=dp,
        extra_mamba_cache_bytes_per_req=0, is_draft_worker=False, model_dtype=torch.bfloat16)
    assert cfg._calculate_mamba_ratio() == (1 if branch == "no_radix" else ratio)
    return cfg


def sglang_reservation(g, cfg, *, draft_tokens):
    """What SGLang 0.5.23 reserves for snapshots (GiB), read off its three branches
    (kv_cache_configurator.py:3319-3386), given the slot count it settled on."""
    s = g["get_schedule"]()
    per_req, dp = cfg.mambaish_config.mamba2_cache_params.mamba_cache_per_req, cfg.attn_dp_size
    reqs = max(1, s.max_running_requests // dp)
    if g["get_memory"]().disable_radix_cache:
        capped = s.max_mamba_cache_size
    else:
        capped = min(reqs, s.max_mamba_cache_size // cfg._calculate_mamba_ratio())
    return per_req * (capped + 1) * draft_tokens / GIB


def hook_registry(source, monkeypatch):
    """SGLang's real HookRegistry / HookType, as module sglang.srt.plugins.hook_registry."""
    import types

    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    exec(compile(source.read_text("sglang/srt/plugins/hook_registry.py"),  # noqa: S102
                 "sglang/srt/plugins/hook_registry.py", "exec"), mod.__dict__)
    install_modules(monkeypatch, {"sglang.srt.plugins": {"hook_registry": mod}})
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)
    return mod.HookRegistry, mod.HookType


def _unreachable(*a, **k):
    raise AssertionError("a stand-in SGLang target ran")


def hooked_sglang(source, monkeypatch, g, originals=None):
    """Stub modules for every hook target (the configurator's methods are SGLang's own),
    the plug-in activated as in a scheduler process, hooks applied by SGLang's registry."""
    registry, hook_type = hook_registry(source, monkeypatch)
    registry.reset()
    o = dict.fromkeys(("forward_extend", "dispatch", "triton", "commit"), _unreachable)
    o.update(originals or {})
    cls = type("KVCacheConfigurator", (), {
        "_handle_max_mamba_cache": g["_handle_max_mamba_cache"],
        "_calculate_mamba_ratio": g["_calculate_mamba_ratio"],
        "_build_hybrid_req_pool": _unreachable})
    g["KVCacheConfigurator"] = cls
    lin = "sglang.srt.layers.attention"
    install_modules(monkeypatch, {
        g["__name__"]: {"KVCacheConfigurator": cls},
        f"{lin}.linear.gdn_backend": {
            "GDNAttnBackend": type("GDNAttnBackend", (), {"forward_extend": o["forward_extend"]}),
            "GDNKernelDispatcher": type("GDNKernelDispatcher", (), {"target_verify": o["dispatch"]})},
        f"{lin}.linear.kernels.gdn_triton": {
            "TritonGDNKernel": type("TritonGDNKernel", (), {"target_verify": o["triton"]})},
        f"{lin}.hybrid_linear_attn_backend": {"HybridLinearAttnBackend": type(
            "HybridLinearAttnBackend", (), {"update_mamba_state_after_mtp_verify": o["commit"]})},
    })
    scheduler = [("sglang.srt.managers.scheduler", "run_scheduler_process")]
    assert plugin._activate(SGLANG_VERSION, registry, hook_type, environ={}, frames=scheduler)
    registry.apply_hooks()
    assert {h.target for h in plugin.HOOKS} <= registry._patched
    assert process.hooks_missing() == []
    return cls


def test_hooks_through_sglangs_registry_pass_other_pools_through(source, monkeypatch, fresh_state):
    """Every hook as SGLang's HookRegistry applies it (AROUND wrappers around the real
    targets' stand-ins): without a Bole pool, SGLang's code runs with its arguments."""
    torch = pytest.importorskip("torch")
    seen = []

    def record(name):
        def fn(self, *a, **k):
            seen.append((name, a, k))
            return name
        return fn

    g = configurator_namespace(source)
    hooked_sglang(source, monkeypatch, g, {n: record(n) for n in ("forward_extend", "dispatch", "triton", "commit")})
    gdn = sys.modules["sglang.srt.layers.attention.linear.gdn_backend"]
    triton_mod = sys.modules["sglang.srt.layers.attention.linear.kernels.gdn_triton"]
    hybrid = sys.modules["sglang.srt.layers.attention.hybrid_linear_attn_backend"]
    backend = gdn.GDNAttnBackend()
    backend.req_to_token_pool = NS(mamba_pool=NS())
    fb = NS(forward_mode=NS(is_target_verify=lambda: True), spec_info=NS(draft_token_num=4))
    assert backend.forward_extend(NS(layer_id=3), fb, "mixed", "a", "b", extra=1) == "forward_extend"
    assert seen[-1] == ("forward_extend", (NS(layer_id=3), fb, "mixed", "a", "b"), {"extra": 1})
    kw = dict(ssm_states=torch.zeros(2, 1, 1, 1), cache_indices="ci", query_start_loc="qsl")
    assert gdn.GDNKernelDispatcher().target_verify(1, 2, 3, 4, 5, 6, 7, **kw) == "dispatch"
    assert triton_mod.TritonGDNKernel().target_verify(1, 2, 3, 4, 5, 6, 7, cache_steps=4, **kw) == "triton"
    assert seen[-1] == ("triton", (1, 2, 3, 4, 5, 6, 7), dict(kw, cache_steps=4))
    h = hybrid.HybridLinearAttnBackend()
    h.linear_attn_backend = backend
    assert h.update_mamba_state_after_mtp_verify("last", "track", "steps", "m", "rpi") == "commit"
    assert seen[-1] == ("commit", ("last", "track", "steps", "m", "rpi"), {})


# ----------------------------------------------------------------- the budget


GRID = [(reqs, d, ratio, branch)
        for branch in ("ratio", "explicit", "no_radix")
        for ratio in (3, 4, 5)
        for reqs in (1, 8, 16, 64)
        for d in (4, 16, 64, 128)]  # 128: past one tile, the verify's scratch is reserved too


@pytest.mark.parametrize("topk", [4, 1])
def test_budget_grid_on_sglangs_own_sizing(source, monkeypatch, fresh_state, topk):
    """Trees and chains (top-k 1) alike: SGLang reserves the same snapshots for both."""
    monkeypatch.delenv("BOLE_CHAINS", raising=False)
    g = configurator_namespace(source)
    stock_fn = g["_handle_max_mamba_cache"]
    cls = hooked_sglang(source, monkeypatch, g)
    assert cls._handle_max_mamba_cache is not stock_fn  # patched by SGLang's registry
    gate = g["_pd_prefill_skips_mamba_spec_state"]
    checked = 0
    for dp in (1, 2):
        for reqs, d, ratio, branch in GRID:
            total = 100.0
            cfg = configure(g, reqs=reqs, draft_tokens=d, ratio=ratio, branch=branch, dp=dp, topk=topk)
            kv_stock = stock_fn(cfg, total)
            slots_stock = g["get_schedule"]().max_mamba_cache_size
            reserved = sglang_reservation(g, cfg, draft_tokens=d)
            cfg = configure(g, reqs=reqs, draft_tokens=d, ratio=ratio, branch=branch, dp=dp, topk=topk)
            plan, why = sizing.configurator_plan(cfg, g)
            assert plan is not None, why
            assert plan.chain == (topk == 1)
            arena = (plan.arena_bytes() + plan.scratch_bytes()) / GIB  # the verify's scratch past one tile
            kv_bole = cls._handle_max_mamba_cache(cfg, total)  # through the registry's wrapper
            case = dict(reqs=reqs, D=d, ratio=ratio, branch=branch, dp=dp, stock=kv_stock,
                        bole=kv_bole, reserved=reserved, arena=arena)
            assert reserved > arena, case
            assert kv_bole >= kv_stock + reserved - arena - 1e-9, case
            assert kv_bole == pytest.approx(kv_stock + reserved - arena, abs=1e-9), case
            assert g["get_schedule"]().max_mamba_cache_size == slots_stock, case  # SGLang's slots
            assert g["_pd_prefill_skips_mamba_spec_state"] is gate
            checked += 1
    assert checked == 2 * len(GRID)


@pytest.mark.parametrize("env", [{}, {"BOLE_CHAINS": "0"}])
@pytest.mark.parametrize("branch", ["ratio", "explicit", "no_radix"])
def test_replayssm_and_switched_off_chains_keep_sglangs_sizing(source, monkeypatch, fresh_state, caplog,
                                                               branch, env):
    """--enable-linear-replayssm-spec (SGLang's snapshot-free chain verify, with its own
    ring sizing) or BOLE_CHAINS=0: through the hooked function the budget and the slots
    are exactly SGLang's, with attention DP too, and one line says why."""
    monkeypatch.delenv("BOLE_CHAINS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    replay = not env
    g = configurator_namespace(source)
    stock_fn = g["_handle_max_mamba_cache"]
    cls = hooked_sglang(source, monkeypatch, g)
    for dp in (1, 2):
        cfg = configure(g, reqs=8, draft_tokens=8, ratio=5, branch=branch, dp=dp, topk=1, replayssm_spec=replay)
        stock = stock_fn(cfg, 100.0)
        stock_slots = g["get_schedule"]().max_mamba_cache_size
        cfg = configure(g, reqs=8, draft_tokens=8, ratio=5, branch=branch, dp=dp, topk=1, replayssm_spec=replay)
        with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
            assert cls._handle_max_mamba_cache(cfg, 100.0) == stock
        assert g["get_schedule"]().max_mamba_cache_size == stock_slots
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert ("--enable-linear-replayssm-spec" if replay else "BOLE_CHAINS='0'") in lines[0]


@pytest.mark.parametrize("reqs,d,stock_gib,stock_slots,old_gib,old_slots", [
    (8, 16, 82.0, 231, 52.7, 986),  # the issue's figures
    (16, 64, 53.8, 66, 52.7, 986),  # 66 // 5 = 13 requests get snapshots
])
def test_issue_figures_and_the_gain_under_sglang_defaults(source, monkeypatch, fresh_state, caplog,
                                                          reqs, d, stock_gib, stock_slots, old_gib,
                                                          old_slots):
    """Qwen3.5-9B, float32 state, 100 GiB after weights, radix cache on (ratio 5), no
    --max-mamba-cache-size: what SGLang gives, what the old answer gave, what Bole gives."""
    g = configurator_namespace(source)
    stock_fn, gate = g["_handle_max_mamba_cache"], g["_pd_prefill_skips_mamba_spec_state"]
    cfg = configure(g, reqs=reqs, draft_tokens=d, ratio=5, branch="ratio")
    assert round(stock_fn(cfg, 100.0), 1) == stock_gib
    assert g["get_schedule"]().max_mamba_cache_size == stock_slots
    cfg = configure(g, reqs=reqs, draft_tokens=d, ratio=5, branch="ratio")
    g["_pd_prefill_skips_mamba_spec_state"] = lambda: True  # the old hook's answer
    assert round(stock_fn(cfg, 100.0), 1) == old_gib
    assert g["get_schedule"]().max_mamba_cache_size == old_slots
    g["_pd_prefill_skips_mamba_spec_state"] = gate
    cls = hooked_sglang(source, monkeypatch, g)
    cfg = configure(g, reqs=reqs, draft_tokens=d, ratio=5, branch="ratio")
    plan, _ = sizing.configurator_plan(cfg, g)
    with caplog.at_level(logging.INFO, logger="bole_cli.sglang.plugin"):
        kv = cls._handle_max_mamba_cache(cfg, 100.0)
    assert g["get_schedule"]().max_mamba_cache_size == stock_slots
    reserved = sglang_reservation(g, cfg, draft_tokens=d)
    assert reserved == pytest.approx(
        (min(reqs, stock_slots // 5) + 1) * d * per_req_bytes(QWEN35_9B) / GIB)
    assert kv == pytest.approx(stock_gib + reserved - (plan.arena_bytes() + plan.scratch_bytes()) / GIB, abs=0.06)
    line = next(r.getMessage() for r in caplog.records if "memory budget" in r.getMessage())
    assert f"reserves {format_bytes(reserved * GIB)}" in line and f"{stock_slots} mamba slots" in line
    print(f"\n[{reqs} x {d}] SGLang {stock_gib} GiB KV, Bole {kv:.2f} GiB KV "
          f"(+{kv - stock_gib:.2f}); snapshots {reserved:.2f} GiB, arena "
          f"{plan.arena_bytes() / GIB:.2f} GiB")


@pytest.mark.parametrize("dp", [1, 2])
@pytest.mark.parametrize("branch", ["ratio", "explicit", "no_radix"])
def test_budget_keeps_sglangs_sizing_when_the_second_pass_fails(source, monkeypatch, fresh_state, caplog,
                                                                 dp, branch):
    """SGLang's first run has already fixed the slot count; a failing second run must leave
    SGLang's own budget and slots, not run the sizing a third time on the pinned schedule
    (which, with attention DP, would divide the slots again)."""
    g = configurator_namespace(source)
    stock_fn = g["_handle_max_mamba_cache"]
    cls = hooked_sglang(source, monkeypatch, g)
    cfg = configure(g, reqs=8, draft_tokens=16, ratio=5, branch=branch, dp=dp)
    stock = stock_fn(cfg, 100.0)
    stock_slots = g["get_schedule"]().max_mamba_cache_size

    cfg = configure(g, reqs=8, draft_tokens=16, ratio=5, branch=branch, dp=dp)
    schedule = g["get_schedule"]()

    def override_fails(self, **fields):
        raise AttributeError("an SGLang change")

    monkeypatch.setattr(type(schedule), "override", override_fails)  # SGLang's own config class
    with caplog.at_level(logging.WARNING, logger="bole_cli.sglang.plugin"):
        kv = cls._handle_max_mamba_cache(cfg, 100.0)
    assert kv == pytest.approx(stock)  # SGLang's own budget: its reservation covers the arena
    assert schedule.max_mamba_cache_size == stock_slots
    assert any("could not size the budget" in r.getMessage() for r in caplog.records)


def test_sglangs_own_sizing_error_reaches_the_caller(source, monkeypatch, fresh_state):
    g = configurator_namespace(source)
    cls = hooked_sglang(source, monkeypatch, g)
    cfg = configure(g, reqs=8, draft_tokens=16, ratio=5, branch="ratio")
    with pytest.raises(RuntimeError):  # SGLang's own "not enough memory", unchanged
        cls._handle_max_mamba_cache(cfg, 0.01)


# ----------------------------------------------------------------- capture buckets


def sizing_modules(source, *, tbo, attn_tp, gathered, cp, zigzag, dp_attention):
    """srt/utils/common.py's batch-size functions, base_cuda_graph_runner's
    get_batch_sizes_to_capture and layers/cp/padding's align size, with stub contexts."""
    parallel = NS(attn_tp_size=attn_tp, attn_cp_size=cp, attn_dp_enabled=dp_attention)
    ex = NS(overlap=NS(enable_two_batch_overlap=tbo),
            graph=NS(torch_compile_max_bs=32, cuda_graph_config=NS(decode=NS(
                bs=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 256]))))
    common = {"get_parallel": lambda: parallel, "get_exec": lambda: ex, "is_hip": lambda: False,
              "require_mlp_tp_gather": lambda: False, "require_attn_tp_gather": lambda: gathered}
    sglang_defs(source, "sglang/srt/utils/common.py", [
        "ceil_div", "ceil_align", "require_gathered_buffer", "require_mlp_sync",
        "get_cuda_graph_batch_size_alignment", "get_cuda_graph_max_batch_size",
        "get_eager_max_batch_size"], common)
    padding = sglang_defs(source, "sglang/srt/layers/cp/padding.py", ["get_cp_padding_align_size"],
                          {"get_parallel": lambda: parallel})
    runner = sglang_defs(source, "sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
                         ["get_batch_sizes_to_capture"], {
                             "get_exec": lambda: ex, "ceil_align": common["ceil_align"],
                             "get_cuda_graph_batch_size_alignment":
                                 common["get_cuda_graph_batch_size_alignment"],
                             "DllmConfig": NS(from_server_args=lambda args: None),
                             "get_flags": lambda: NS(capture=NS(enable_torch_compile=False))})
    return common, padding, runner, {"sglang.srt.layers.cp.base": {"is_zigzag": lambda: zigzag}}


def test_arena_rows_cover_every_capture_bucket(source, monkeypatch, fresh_state):
    from bole_cli.sglang.plan import decide

    from test_plugin import eligible_facts

    checked = exceeded_eager = 0
    for tbo in (False, True):
        for attn_tp in (1, 2, 4, 8):
            for gathered in (False, True):
                for cp in (1, 2, 3, 4):
                    for zigzag in (False, True):
                        for dp_attention in (False, True):
                            common, padding, runner, extra = sizing_modules(
                                source, tbo=tbo, attn_tp=attn_tp, gathered=gathered, cp=cp,
                                zigzag=zigzag, dp_attention=dp_attention)
                            install_modules(monkeypatch, {"sglang.srt.utils.common": common,
                                                          "sglang.srt.layers.cp.padding": padding,
                                                          **extra})
                            for reqs in (1, 3, 5, 8, 13, 16, 33):
                                bound = sizing.largest_verify_batch(reqs)
                                plan, _ = decide(eligible_facts(max_batch=bound))
                                chain, _ = decide(eligible_facts(max_batch=bound, topk=1))
                                assert chain.chain and chain.rows == plan.rows  # chains alike
                                eager = common["get_eager_max_batch_size"](reqs)
                                for d in (1, 4, 16):
                                    model_runner = NS(req_to_token_pool=NS(size=reqs), server_args=None)
                                    try:
                                        buckets, _ = runner["get_batch_sizes_to_capture"](model_runner, d)
                                    except AssertionError:  # SGLang refuses this layout itself
                                        continue
                                    case = dict(tbo=tbo, tp=attn_tp, gathered=gathered, cp=cp,
                                                zigzag=zigzag, reqs=reqs, D=d, buckets=buckets)
                                    assert max(buckets) <= bound and eager <= bound, case
                                    assert max(buckets) + 1 <= plan.rows, case
                                    exceeded_eager += max(buckets) > max(eager, reqs)
                                    checked += 1
    assert checked > 1000
    assert exceeded_eager > 0  # eager padding alone (the old sizing) was too small


def test_capture_bucket_larger_than_eager_reaches_the_pool_arena(source, monkeypatch, fresh_state):
    """Two-batch overlap, 3 requests: the capture bucket is 4; the pool's arena holds it."""
    pytest.importorskip("torch")
    from test_plugin import _fake_configurator, _fake_configurator_module

    common, padding, runner, extra = sizing_modules(source, tbo=True, attn_tp=1, gathered=False, cp=1,
                                                    zigzag=False, dp_attention=False)
    install_modules(monkeypatch, {"sglang.srt.utils.common": common,
                                  "sglang.srt.layers.cp.padding": padding, **extra})
    buckets, _ = runner["get_batch_sizes_to_capture"](NS(req_to_token_pool=NS(size=3), server_args=None), 16)
    assert max(buckets) == 4 and common["get_eager_max_batch_size"](3) == 3
    ns = _fake_configurator_module()
    ns["get_schedule"]().max_running_requests = 3
    built = hooks._around_build_hybrid_req_pool(ns["_build_hybrid_req_pool"], _fake_configurator(),
                                                 max_num_reqs=3, extra_max_context_len=0)
    assert built.bole_plan.rows == 5


def test_a_scheduler_whose_capture_sizing_fails_refuses_the_plugin(monkeypatch, fresh_state):
    """Fail closed: sizing the arena for the raw request count would crash graph capture."""
    from test_plugin import _fake_configurator, _fake_configurator_module

    def broken(reqs):
        raise RuntimeError("SGLang's context is not set up")

    install_modules(monkeypatch, {"sglang.srt.utils.common": {
        "get_eager_max_batch_size": lambda reqs: reqs, "get_cuda_graph_max_batch_size": broken}})
    ns = _fake_configurator_module()
    assert sizing.configurator_plan(_fake_configurator(), ns)[0] is not None  # tests: warned, reqs used
    monkeypatch.setattr(process, "process_role", lambda frames=None: "scheduler")
    plan, why = sizing.configurator_plan(_fake_configurator(), ns)
    assert plan is None and "RuntimeError" in why
