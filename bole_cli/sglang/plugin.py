"""Bole's SGLang 0.5.23 plug-in (entry point ``bole`` in group ``sglang.srt.plugins``).

SGLang calls `activate` in every process that runs ``load_plugins()`` (the server, each
scheduler, the detokenizer...). On SGLang 0.5.23 it registers six AROUND hooks with
``sglang.srt.plugins.hook_registry.HookRegistry`` (`HOOKS`); on any other version it logs
one line and registers nothing. The hooks touch only hybrid Gated-DeltaNet models served
with an EAGLE-family tree draft (``--speculative-eagle-topk > 1``); every other path
(chains, prefill, decode, other models, ReplaySSM, PD disaggregation, ...) reaches
SGLang's own code unchanged. Per pool, the decision and its reason are logged once.

What each hook does (tensor plumbing in `factors`, pool in `pool`, sizes in `plan`):

1. ``KVCacheConfigurator._handle_max_mamba_cache``: SGLang's memory budget reserves
   ``mamba_cache_per_req * (reqs + 1) * D`` for per-node snapshots; Bole drops that
   reservation (by answering its "skip spec state" test) and reserves its factor arena
   instead, so the difference goes to the KV cache (and, in SGLang's ratio-based sizing,
   partly to more mamba slots). Logged.
2. ``KVCacheConfigurator._build_hybrid_req_pool``: while SGLang builds the hybrid request
   pool, ``HybridReqToTokenPool.mamba_pool_cls`` is a MambaPool subclass that allocates the
   factor arena instead of ``intermediate_ssm`` / ``intermediate_conv_window`` (logged).
3. ``GDNAttnBackend.forward_extend`` (TARGET_VERIFY on a Bole pool): before SGLang's tree
   conv overwrites the committed conv window, keep the conv inputs and the old window.
4. ``TritonGDNKernel.target_verify`` (and the dispatcher in front of it, so that no other
   verify backend, e.g. FlashInfer in a dummy run without a tree, can write into the
   placeholder snapshot buffer): on a Bole pool (found by ``ssm_states.data_ptr()``),
   Bole's closed form with SGLang's gates / l2norm / scale; k, u, log_p go to the arena.
   Other pools: SGLang's code, arguments untouched.
5. ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``: on a Bole pool, one
   tree_commit over all GDN layers + one conv-window commit for the accepted nodes, and
   the same for the prefix-cache track slots; SGLang's PLE side-state update still runs.

Checks of these names against SGLang's source (no import): `check_plugin_targets`.
This module imports only the standard library at import time.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from bole_cli.sglang.compat import SGLANG_VERSION
from bole_cli.sglang.hooks import HOOK_TARGETS, HookTarget
from bole_cli.sglang.plan import ENV_DISABLE, ENV_PRECISION, BolePlan, decide, gib

logger = logging.getLogger("bole_cli.sglang.plugin")

PLUGIN_NAME = "bole"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT = "bole_cli.sglang.plugin:activate"

_TV = "sglang.srt.layers.attention"
_KVC = "sglang.srt.mem_cache.kv_cache_configurator"
_MP = "sglang.srt.mem_cache.memory_pool"


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path as HookRegistry.register takes it
    function: str  # the AROUND hook in this module
    why: str


HOOKS: tuple[Hook, ...] = (
    Hook(f"{_KVC}.KVCacheConfigurator._handle_max_mamba_cache", "_around_handle_max_mamba_cache",
         "memory budget: no snapshot reservation, the factor arena instead"),
    Hook(f"{_KVC}.KVCacheConfigurator._build_hybrid_req_pool", "_around_build_hybrid_req_pool",
         "build the hybrid request pool with a snapshot-free MambaPool"),
    Hook(f"{_TV}.linear.gdn_backend.GDNAttnBackend.forward_extend", "_around_forward_extend",
         "keep conv inputs and the pre-verify conv window before SGLang's tree conv"),
    Hook(f"{_TV}.linear.gdn_backend.GDNKernelDispatcher.target_verify", "_around_target_verify",
         "Bole pools never reach a snapshotting verify kernel, whichever backend is configured"),
    Hook(f"{_TV}.linear.kernels.gdn_triton.TritonGDNKernel.target_verify", "_around_target_verify",
         "tree verify in closed form; factors instead of snapshots"),
    Hook(f"{_TV}.hybrid_linear_attn_backend.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify",
         "_around_commit", "factorised commit of the accepted node (and track slots)"),
)

# SGLang names the hooks read or call besides their targets (checked like HOOK_TARGETS).
PLUGIN_TARGETS: tuple[HookTarget, ...] = (
    HookTarget(f"{_KVC}.KVCacheConfigurator._build_hybrid_req_pool", "wrap",
               ("self", "*", "max_num_reqs", "extra_max_context_len"), 1700,
               "builds HybridReqToTokenPool(mamba_spec_state_size=max_num_reqs, ...)"),
    HookTarget(f"{_KVC}._pd_prefill_skips_mamba_spec_state", "call", (), 172,
               "the budget's 'reserve snapshots?' test; answered True while Bole sizes the budget"),
    HookTarget(f"{_MP}.HybridReqToTokenPool.mamba2_layer_index", "call", ("self", "layer_id"), 1667,
               "model layer id -> pool layer index"),
    HookTarget(f"{_MP}.MambaPool.State.at_layer_idx", "call", ("self", "layer"), 540,
               "per-layer view; Bole's SpeculativeState overrides it"),
    HookTarget(f"{_TV}.hybrid_linear_attn_backend.HybridLinearAttnBackend._update_ple_state_after_mtp_verify",
               "call", ("self", "state_indices_tensor", "last_correct_step_indices",
                        "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"), 1660,
               "Qwen4-Exp side states; still run after Bole's commit"),
    HookTarget(f"{_TV}.hybrid_linear_attn_backend.MambaAttnBackendBase._translate_mamba_indices",
               "call", ("self", "mamba_indices"), 144, "virtual -> physical track slots"),
    HookTarget(f"{_TV}.linear.utils.pp_spec_stable_rows_enabled", "call", (), 16,
               "stable-row pipeline speculation (Bole stays out)"),
    HookTarget("sglang.srt.utils.common.get_eager_max_batch_size", "call", ("max_batch_size",), 4188,
               "eager batches may be padded past max running requests: arena rows"),
    HookTarget("sglang.srt.runtime_context.max_speculative_num_draft_tokens", "call", (), 1982,
               "D of the pool"),
)

# Source facts the plug-in relies on, as (file, text that must appear, why).
SOURCE_FACTS: tuple[tuple[str, str, str], ...] = (
    ("sglang/srt/layers/attention/linear/gdn_backend.py",
     "mamba_cache_params.intermediate_conv_window[0]",
     "the verify branch takes layer view [0]: Bole's view gives None"),
    ("sglang/srt/layers/attention/linear/gdn_backend.py",
     "assert intermediate_state_cache is not None",
     "the verify branch needs a (placeholder) intermediate_ssm"),
    ("sglang/srt/layers/attention/linear/gdn_backend.py",
     "self.req_to_token_pool.mamba2_layer_cache(layer.layer_id)",
     "forward_extend reads the pool through mamba2_layer_cache"),
    ("sglang/kernels/ops/mamba/causal_conv1d_triton.py",
     "SAVE_INTERMEDIATE=intermediate_conv_window is not None",
     "tree conv without window snapshots when the window is None"),
    ("sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
     "self.linear_attn_backend.forward_metadata.mamba_cache_indices[",
     "the commit's destination slots come from the verify's metadata"),
    ("sglang/srt/mem_cache/memory_pool.py", "self.mamba_pool = self.mamba_pool_cls(",
     "the pool class is read from mamba_pool_cls"),
    ("sglang/srt/mem_cache/kv_cache_configurator.py",
     "and not _pd_prefill_skips_mamba_spec_state()",
     "the budget's snapshot reservation is gated by this module-level function"),
)

_state: dict[str, Any] = {"active": False, "reason": "not activated"}
_logged: set[str] = set()


def _log_once(level: int, message: str, *args: Any) -> None:
    key = message % args if args else message
    if key not in _logged:
        _logged.add(key)
        logger.log(level, message, *args)


# --------------------------------------------------------------------------- activation


def sglang_version() -> Optional[str]:
    """The running SGLang's version (its own module first, then package metadata)."""
    mod = sys.modules.get("sglang.version") or sys.modules.get("sglang")
    ver = getattr(mod, "__version__", None)
    if isinstance(ver, str):
        return ver
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - no metadata: try importing its version module
        pass
    try:
        from sglang.version import __version__  # type: ignore[import-not-found]

        return str(__version__)
    except Exception:  # noqa: BLE001
        return None


def activate() -> bool:
    """The entry point SGLang calls (zero arguments). True when the hooks are registered."""
    return _activate(sglang_version())


def _activate(version: Optional[str], registry: Any = None, hook_type: Any = None,
              environ: Optional[dict] = None) -> bool:
    env = os.environ if environ is None else environ
    if _state["active"]:
        return True
    if env.get(ENV_DISABLE, "").strip().lower() not in ("", "0", "false", "no"):
        _state["reason"] = f"{ENV_DISABLE} is set"
        logger.warning("Bole plug-in: %s; staying inactive (SGLang runs unchanged)", _state["reason"])
        return False
    if version != SGLANG_VERSION:
        _state["reason"] = f"SGLang {version or 'of unknown version'}"
        logger.warning("Bole plug-in: found SGLang %s but Bole is pinned to SGLang %s; staying "
                       "inactive (SGLang runs unchanged; pip install 'bole-cli[serve]')",
                       version or "(version unknown)", SGLANG_VERSION)
        return False
    if registry is None or hook_type is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore

        registry, hook_type = HookRegistry, HookType
    module = sys.modules[__name__]
    for hook in HOOKS:
        registry.register(hook.target, getattr(module, hook.function), hook_type.AROUND)
    _state.update(active=True, reason="")
    logger.info("Bole plug-in: active on SGLang %s (%d hooks); tree verify of Gated DeltaNet "
                "layers uses Bole's closed form and factorised commit", version, len(HOOKS))
    return True


def check_plugin_targets(source: Any = None) -> list[str]:
    """Every name the plug-in hooks or uses, and its source facts, against SGLang's source
    (an SGLangSource, a path, or None for compat's search); one line per problem."""
    from bole_cli.sglang.compat import SGLangSource, find_sglang_source
    from bole_cli.sglang.hooks import check_hook_targets

    if not isinstance(source, SGLangSource):
        source = find_sglang_source(source, version=None)
    known = {t.target: t for t in (*HOOK_TARGETS, *PLUGIN_TARGETS)}
    problems = [f"{h.target}: hooked but not listed in HOOK_TARGETS / PLUGIN_TARGETS"
                for h in HOOKS if h.target not in known or known[h.target].params is None]
    problems += check_hook_targets(source, tuple(known.values()))
    for rel, text, why in SOURCE_FACTS:
        try:
            body = source.read_text(rel)
        except Exception as exc:  # noqa: BLE001 - report, do not raise
            problems.append(f"{rel}: unreadable ({exc})")
            continue
        if text not in body:
            problems.append(f"{rel}: no longer contains {text!r} ({why})")
    return problems


# --------------------------------------------------------------------------- planning


def _truthy(value: Optional[str]) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no")


def _pp_spec_enabled() -> bool:
    try:
        from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled  # type: ignore

        return bool(pp_spec_stable_rows_enabled())
    except Exception:  # noqa: BLE001 - fall back to the variable it reads
        return _truthy(os.environ.get("SGLANG_ENABLE_PP_SPEC"))


def _eager_max_batch(reqs: int) -> int:
    try:
        from sglang.srt.utils.common import get_eager_max_batch_size  # type: ignore

        return max(int(get_eager_max_batch_size(reqs)), reqs)
    except Exception:  # noqa: BLE001
        return reqs


def configurator_facts(cfg: Any, g: dict) -> dict:
    """Plain facts for `plan.decide` from a KVCacheConfigurator and its module globals."""
    spec, mem, disagg, ex, sched = (g[n]() for n in
                                    ("get_spec", "get_memory", "get_disagg", "get_exec", "get_schedule"))
    params = cfg.mambaish_config.mamba2_cache_params
    reqs = max(1, int(sched.max_running_requests or 1) // max(int(getattr(cfg, "attn_dp_size", 1) or 1), 1))
    algo = getattr(getattr(cfg, "spec_algorithm", None), "name", None) or spec.speculative_algorithm
    return dict(
        disabled=_truthy(os.environ.get(ENV_DISABLE)),
        gdn=getattr(cfg, "hybrid_gdn_config", None) is not None,
        kda=getattr(cfg, "hybrid_kda_config", None) is not None,
        draft_worker=bool(getattr(cfg, "is_draft_worker", False)),
        algorithm=str(algo or ""),
        topk=spec.speculative_eagle_topk,
        draft_tokens=g["max_speculative_num_draft_tokens"](),
        replayssm=bool(ex.mamba.enable_linear_replayssm),
        replayssm_spec=bool(ex.mamba.enable_linear_replayssm_spec),
        unified_memory=bool(mem.enable_unified_memory),
        page_major=bool(getattr(mem, "enable_page_major_kv_layout", False)),
        disagg_mode=str(disagg.disaggregation_mode),
        role_switch=bool(getattr(disagg, "enable_pd_role_switch", False)),
        npu=bool(g.get("_is_npu", False)),
        hip=bool(g.get("_is_hip", False)),
        pp_spec=_pp_spec_enabled(),
        conv_shapes=[tuple(s) for s in params.shape.conv],
        temporal=tuple(params.shape.temporal),
        key_heads=int(params.shape.num_k_heads_per_tp),
        layers=len(params.layers),
        ssm_dtype=params.dtype.temporal,
        conv_dtype=params.dtype.conv,
        act_dtype=getattr(cfg, "model_dtype", None),
        max_batch=_eager_max_batch(reqs),
        precision=os.environ.get(ENV_PRECISION) or None,
    )


def hooks_missing() -> list[str]:
    """Bole's hook targets that SGLang's HookRegistry did not patch (all or nothing: a pool
    without snapshots needs every hook). Empty when the registry is not loaded (tests)."""
    registry_mod = sys.modules.get("sglang.srt.plugins.hook_registry")
    registry = getattr(registry_mod, "HookRegistry", None)
    patched = getattr(registry, "_patched", None)
    if registry is None or not _state["active"]:
        return [] if registry is None else ["the plug-in is not active"]
    if not isinstance(patched, (set, frozenset)):
        return ["HookRegistry._patched (cannot tell which hooks applied)"]
    return [h.target for h in HOOKS if h.target not in patched]


def configurator_plan(cfg: Any, g: dict) -> tuple[Optional[BolePlan], str]:
    missing = hooks_missing()
    if missing:
        return None, "hooks not applied: " + ", ".join(missing)
    try:
        facts = configurator_facts(cfg, g)
    except Exception as exc:  # noqa: BLE001 - an SGLang change: stay out, say why
        return None, f"could not read SGLang's configuration ({type(exc).__name__}: {exc})"
    return decide(facts)


# --------------------------------------------------------------------------- hooks


def _module_globals(fn: Callable) -> dict:
    """The globals of the module defining `fn`, through other plug-ins' wrappers."""
    import inspect

    return inspect.unwrap(fn).__globals__


def _around_handle_max_mamba_cache(original: Callable, self: Any, total_rest_memory: float):
    g = _module_globals(original)
    plan, why = configurator_plan(self, g)
    if plan is None:
        _log_once(logging.INFO, "Bole plug-in: SGLang's own speculative state for this model (%s)", why)
        return original(self, total_rest_memory)
    name = "_pd_prefill_skips_mamba_spec_state"
    saved = g.get(name)
    if not callable(saved):
        _log_once(logging.WARNING, "Bole plug-in: %s not found; SGLang's snapshot reservation "
                  "stays in the memory budget", name)
        return original(self, total_rest_memory)
    g[name] = lambda: True
    try:
        rest = original(self, total_rest_memory)
    finally:
        g[name] = saved
    logger.info("Bole plug-in: memory budget without per-node snapshots (SGLang would reserve "
                "about %s); %s reserved for Bole's factor arena", gib(plan.snapshot_bytes()),
                gib(plan.arena_bytes()))
    return rest - plan.arena_bytes() / (1 << 30)


def _around_build_hybrid_req_pool(original: Callable, self: Any, *args: Any, **kwargs: Any):
    g = _module_globals(original)
    plan, why = configurator_plan(self, g)
    pool_cls_owner = g.get("HybridReqToTokenPool")
    if plan is None or pool_cls_owner is None:
        _log_once(logging.INFO, "Bole plug-in: SGLang's own speculative state for this model (%s)",
                  why or "HybridReqToTokenPool not found")
        return original(self, *args, **kwargs)
    from bole_cli.sglang.pool import bole_pool_class

    base = pool_cls_owner.mamba_pool_cls
    pool_cls_owner.mamba_pool_cls = bole_pool_class(base, plan)
    try:
        return original(self, *args, **kwargs)
    finally:
        pool_cls_owner.mamba_pool_cls = base


def _bole_store(pool: Any):
    return getattr(getattr(pool, "mamba_pool", None), "bole_store", None)


def _around_forward_extend(original: Callable, self: Any, layer: Any, forward_batch: Any,
                           mixed_qkv: Any, a: Any, b: Any, **kwargs: Any):
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is not None and mode.is_target_verify():
        pool = self.req_to_token_pool
        store = _bole_store(pool)
        if store is not None and getattr(self, "mis_metadata", None) is None and hasattr(mixed_qkv, "shape"):
            index = pool.mamba2_layer_index(layer.layer_id)
            store.capture_conv(index, mixed_qkv, pool.mamba_pool.mamba_cache.conv[0][index],
                               self.forward_metadata.mamba_cache_indices,
                               forward_batch.spec_info.draft_token_num)
    return original(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)


_VERIFY_POSITIONAL = ("A_log", "dt_bias", "q", "k", "v", "a", "b")


def _around_target_verify(original: Callable, self: Any, *args: Any, **kwargs: Any):
    """Both GDNKernelDispatcher.target_verify and TritonGDNKernel.target_verify: on a Bole
    pool, Bole's verify (whatever verify backend SGLang would pick: the pool's snapshot
    buffer is only a placeholder); otherwise the original, with the arguments untouched."""
    from bole_cli.sglang import factors

    found = factors.lookup(kwargs.get("ssm_states"))
    if found is None:
        return original(self, *args, **kwargs)
    p = dict(zip(_VERIFY_POSITIONAL, args))
    p.update((name, kwargs[name]) for name in _VERIFY_POSITIONAL if name in kwargs)
    store, layer = found
    return store.verify(layer, p["A_log"], p["dt_bias"], p["q"], p["k"], p["v"], p["a"], p["b"],
                        ssm_states=kwargs["ssm_states"], cache_indices=kwargs["cache_indices"],
                        query_start_loc=kwargs["query_start_loc"],
                        retrieve_parent_token=kwargs.get("retrieve_parent_token"),
                        draft_token_num=kwargs.get("cache_steps"))


def _around_commit(original: Callable, self: Any, last_correct_step_indices: Any,
                   mamba_track_indices: Any, mamba_steps_to_track: Any, model: Any,
                   req_pool_indices: Any = None):
    backend = self.linear_attn_backend
    mamba_pool = backend.req_to_token_pool.mamba_pool
    store = getattr(mamba_pool, "bole_store", None)
    if store is None:
        return original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track,
                        model, req_pool_indices)
    n = last_correct_step_indices.shape[0]
    if mamba_track_indices is not None:
        mamba_track_indices = backend._translate_mamba_indices(mamba_track_indices)
    meta = backend.forward_metadata
    dst = meta.mamba_cache_indices[:n]
    cache = mamba_pool.mamba_cache
    store.commit(cache.temporal, cache.conv[0], dst, last_correct_step_indices, meta.query_start_loc,
                 mamba_track_indices, mamba_steps_to_track)
    self._update_ple_state_after_mtp_verify(dst, last_correct_step_indices, mamba_track_indices,
                                            mamba_steps_to_track, None)
