"""What the Bole plug-in reads from SGLang's configurator to size its pool and budget.

`configurator_facts` turns a KVCacheConfigurator and the globals of its module into plain
facts for `plan.decide` (`configurator_plan`: the plan, or None and why), with the largest
batch one verify can carry (`largest_verify_batch`: the factor arena needs a row per
request of it). `budget_without_snapshots` runs SGLang's own memory sizing a second time
without its per-node snapshot reservation. docs/design.md §6; the SGLang names read here
are rows of `targets.SGLANG_TARGETS`.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Optional

from bole_cli.sglang import process
from bole_cli.sglang.plan import ENV_CHAINS, ENV_DISABLE, ENV_PRECISION, BolePlan, decide, plugin_disabled


def _pp_spec_enabled() -> bool:
    try:
        from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled  # type: ignore

        return bool(pp_spec_stable_rows_enabled())
    except Exception:  # noqa: BLE001 - fall back to the variable it reads
        return process.truthy(os.environ.get("SGLANG_ENABLE_PP_SPEC"))


def largest_verify_batch(reqs: int) -> int:
    """The most requests one verify can carry with `reqs` requests per DP shard: SGLang's
    padded eager batch (get_eager_max_batch_size) or its largest CUDA-graph capture bucket
    (get_cuda_graph_max_batch_size: the pool size rounded up to the capture alignment, x2
    with two-batch overlap, x the attention tensor-parallel size when gathered, x attention
    context parallelism; base_cuda_graph_runner's capture sizes). The arena needs one row per request of it, so in a
    scheduler a failure here refuses the plug-in (an arena sized for `reqs` alone would make
    the factor store raise during graph capture); elsewhere (tests) `reqs` is used."""
    common = importlib.import_module("sglang.srt.utils.common")

    sizes = [reqs]
    for name in ("get_eager_max_batch_size", "get_cuda_graph_max_batch_size"):
        try:
            sizes.append(int(getattr(common, name)(reqs)))
        except Exception as exc:  # noqa: BLE001 - SGLang's context not set up (tests)
            if process.process_role() == "scheduler":
                raise
            process.log_once(logging.WARNING, "Bole plug-in: %s(%d) failed (%s); sizing the factor arena "
                      "for %d requests", name, reqs, type(exc).__name__, reqs)
    return max(sizes)


def _max_batch(reqs: int) -> int:
    try:
        return largest_verify_batch(reqs)
    except ImportError:  # SGLang's utils not importable (tests): the requests themselves
        if process.process_role() == "scheduler":
            raise
        return reqs


def configurator_facts(cfg: Any, sglang_globals: dict) -> dict:
    """Plain facts for `plan.decide` from a KVCacheConfigurator and the globals of its module
    (kv_cache_configurator: the runtime-context getters, the platform flags)."""
    spec, mem, disagg, ex, sched = (sglang_globals[n]() for n in
                                    ("get_spec", "get_memory", "get_disagg", "get_exec", "get_schedule"))
    params = cfg.mambaish_config.mamba2_cache_params
    reqs = max(1, int(sched.max_running_requests or 1) // max(int(getattr(cfg, "attn_dp_size", 1) or 1), 1))
    algo = getattr(getattr(cfg, "spec_algorithm", None), "name", None) or spec.speculative_algorithm
    return dict(
        disabled=plugin_disabled(os.environ.get(ENV_DISABLE)),
        gdn=getattr(cfg, "hybrid_gdn_config", None) is not None,
        kda=getattr(cfg, "hybrid_kda_config", None) is not None,
        draft_worker=bool(getattr(cfg, "is_draft_worker", False)),
        algorithm=str(algo or ""),
        topk=spec.speculative_eagle_topk,
        num_steps=getattr(spec, "speculative_num_steps", None),
        chains=os.environ.get(ENV_CHAINS),
        draft_tokens=sglang_globals["max_speculative_num_draft_tokens"](),
        replayssm=bool(ex.mamba.enable_linear_replayssm),
        replayssm_spec=bool(ex.mamba.enable_linear_replayssm_spec),
        unified_memory=bool(mem.enable_unified_memory),
        page_major=bool(getattr(mem, "enable_page_major_kv_layout", False)),
        disagg_mode=str(disagg.disaggregation_mode),
        role_switch=bool(getattr(disagg, "enable_pd_role_switch", False)),
        npu=bool(sglang_globals.get("_is_npu", False)),
        hip=bool(sglang_globals.get("_is_hip", False)),
        pp_spec=_pp_spec_enabled(),
        torch_compile=bool(getattr(getattr(ex, "graph", None), "enable_torch_compile", False)),
        conv_shapes=[tuple(s) for s in params.shape.conv],
        temporal=tuple(params.shape.temporal),
        key_heads=int(params.shape.num_k_heads_per_tp),
        layers=len(params.layers),
        ssm_dtype=params.dtype.temporal,
        conv_dtype=params.dtype.conv,
        act_dtype=getattr(cfg, "model_dtype", None),
        max_batch=_max_batch(reqs),
        precision=os.environ.get(ENV_PRECISION) or None,
    )


def configurator_plan(cfg: Any, sglang_globals: dict) -> tuple[Optional[BolePlan], str]:
    missing = process.hooks_missing()
    if missing:
        return None, "hooks not applied: " + ", ".join(missing)
    try:
        facts = configurator_facts(cfg, sglang_globals)
    except Exception as exc:  # noqa: BLE001 - an SGLang change: stay out, say why
        return None, f"could not read SGLang's configuration ({type(exc).__name__}: {exc})"
    return decide(facts)


def budget_without_snapshots(original: Callable, cfg: Any, total_rest_memory: float,
                             sglang_globals: dict) -> tuple[float, int]:
    """(rest without SGLang's snapshot reservation in GiB, mamba slots), after SGLang's own
    sizing has run once (which fixed the slot count in the schedule).

    Runs SGLang's sizing again with that count pinned (a scoped override of the schedule's
    max_mamba_cache_size, times attn_dp_size: the explicit branch divides by it) and
    `_pd_prefill_skips_mamba_spec_state` answering True, so the same slots are charged and
    no snapshots: the difference from the first run is exactly the reservation SGLang made."""
    name = "_pd_prefill_skips_mamba_spec_state"
    gate, schedule = sglang_globals.get(name), sglang_globals["get_schedule"]()
    if not callable(gate):
        raise LookupError(f"{name} not found")
    slots = int(schedule.max_mamba_cache_size)
    dp = max(int(getattr(cfg, "attn_dp_size", 1) or 1), 1)
    sglang_globals[name] = lambda: True
    try:
        with schedule.override(max_mamba_cache_size=slots * dp):
            free = original(cfg, total_rest_memory)
    finally:
        sglang_globals[name] = gate
    return free, slots
