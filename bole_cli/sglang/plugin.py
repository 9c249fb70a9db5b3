"""Bole's SGLang 0.5.23 plug-in (entry point ``bole`` in group ``sglang.srt.plugins``).

SGLang calls `activate` in every process that runs ``load_plugins()`` (the launcher, each
scheduler, the DP controller, the detokenizer). It registers six AROUND hooks with
``sglang.srt.plugins.hook_registry.HookRegistry`` (`HOOKS`) only where a scheduler runs
(`process_role`): registering makes ``apply_hooks`` import the attention and model-runner
stack, which the other processes never need. It accepts SGLang 0.5.23 and its post
releases whose hooked names and source facts still check out against their source
(`version_problem`); on any other version it logs one line and registers nothing. Under
SGLang's Ray launcher the scheduler actors never call ``load_plugins()``: `ray_worker_setup`
is the Ray ``worker_process_setup_hook`` that makes them load it, and the launcher logs
that it is needed (docs/sglang-0.5.23.md (c)). The hooks touch only hybrid Gated-DeltaNet models served
with an EAGLE-family draft: a tree (``--speculative-eagle-topk > 1``) or a chain (top-k 1,
the tree whose parents are 0..D-2; ``BOLE_CHAINS=0`` leaves chains to SGLang); every other
path (prefill, decode, other models, ReplaySSM, PD disaggregation, ...) reaches SGLang's
own code unchanged. Per pool, the decision and its reason are logged once.

What each hook does (tensor plumbing in `factors`, pool in `pool`, sizes in `plan`):

1. ``KVCacheConfigurator._handle_max_mamba_cache``: SGLang's memory budget reserves
   ``mamba_cache_per_req * (capped reqs + 1) * D`` for per-node snapshots, in one of three
   branches (explicit ``--max-mamba-cache-size``, ``--disable-radix-cache``, or the
   ratio-based default). Bole runs SGLang's sizing as is (so the mamba slot count is
   SGLang's), then once more with that slot count pinned and the "reserve snapshots?" test
   answered no: the difference is exactly SGLang's reservation, which goes to the KV cache
   less Bole's factor arena (`budget_without_snapshots`). Logged.
2. ``KVCacheConfigurator._build_hybrid_req_pool``: while SGLang builds the hybrid request
   pool, ``HybridReqToTokenPool.mamba_pool_cls`` is a MambaPool subclass that allocates the
   factor arena instead of ``intermediate_ssm`` / ``intermediate_conv_window`` (logged).
3. ``GDNAttnBackend.forward_extend`` (TARGET_VERIFY on a Bole pool): before SGLang's tree
   or chain conv overwrites the committed conv window, keep the conv inputs and the old window.
4. ``TritonGDNKernel.target_verify`` (and the dispatcher in front of it, so that no other
   verify backend, e.g. FlashInfer in a dummy run without a tree, can write into the
   placeholder snapshot buffer): on a Bole pool (found by ``ssm_states.data_ptr()``),
   Bole's closed form with SGLang's gates / l2norm / scale; k, u, log_p go to the arena.
   Parents come from SGLang's retrieve_parent_token (trees); a chain has none (its verify
   metadata carries no retrive_* tensors), so its parents are 0..D-2.
   Other pools: SGLang's code, arguments untouched.
5. ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``: on a Bole pool, one
   tree_commit over all GDN layers + one conv-window commit for the accepted nodes, and
   the same for the prefix-cache track slots; SGLang's PLE side-state update still runs.

Checks of these names against SGLang's source (no import): `check_plugin_targets`.
This module imports only the standard library at import time.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from bole_cli.sglang.source import SGLANG_VERSION
from bole_cli.sglang.hooks import HOOK_TARGETS, HookTarget
from bole_cli.memory import format_bytes
from bole_cli.sglang.plan import (ENV_CHAINS, ENV_DISABLE, ENV_PRECISION, BolePlan, chains_enabled,
                                  decide)

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
    HookTarget("sglang.srt.utils.common.get_cuda_graph_max_batch_size", "call", ("max_batch_size",), 4184,
               "the largest CUDA-graph capture bucket (capture alignment): arena rows"),
    HookTarget("sglang.srt.runtime_context._ConfigBag.override", "call", ("self", "**kwargs"), 849,
               "scoped override: pins max_mamba_cache_size for the budget's second pass"),
    HookTarget("sglang.srt.plugins.load_plugins", "call", (), 103,
               "what ray_worker_setup runs in a Ray scheduler actor"),
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
    ("sglang/srt/mem_cache/kv_cache_configurator.py",
     "if get_schedule().max_mamba_cache_size is not None:",
     "a pinned slot count takes the explicit branch (the budget's second pass)"),
    ("sglang/srt/mem_cache/kv_cache_configurator.py",
     "max_mamba_cache_size=get_schedule().max_mamba_cache_size\n                // self.attn_dp_size",
     "the explicit branch divides the slot count by attn_dp_size"),
    ("sglang/srt/model_executor/runner/base_cuda_graph_runner.py",
     "num_max_requests = ceil_align(num_max_requests, mul_base)",
     "capture buckets stop at the pool size rounded up to the capture alignment"),
    ("sglang/srt/managers/scheduler.py", "    load_plugins()\n",
     "scheduler processes load plug-ins (run_scheduler_process)"),
    ("sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
     "self.topk = get_spec().speculative_eagle_topk or 0",
     "an unset top-k is a chain (plan.is_chain)"),
    ("sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
     "                if self.topk > 1:\n"
     "                    retrieve_next_token = forward_batch.spec_info.retrieve_next_token",
     "eager chain verifies carry no retrive_* tensors: Bole's verify builds the chain's parents"),
    ("sglang/srt/layers/attention/hybrid_linear_attn_backend.py",
     "if is_target_verify and self.topk > 1:",
     "CUDA-graph chain verifies carry no retrive_* tensors either"),
    ("sglang/srt/speculative/spec_utils.py",
     "accept_index[req_idx, (accept_lens - 1).to(torch.int64)] - accept_indices_offset",
     "the commit's step index is the accepted node's local index (chains: accept_lens - 1)"),
)

# Frames (module, function) that mark a process running an SGLang scheduler.
SCHEDULER_FRAMES: tuple[tuple[str, str], ...] = (
    ("sglang.srt.managers.scheduler", "run_scheduler_process"),
    (__name__, "ray_worker_setup"),
)
LOADER_FRAME = ("sglang.srt.plugins", "load_plugins")
_POST_RELEASE = re.compile(re.escape(SGLANG_VERSION) + r"\.post\d+")

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


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for SGLang's Ray launcher (``--use-ray``): its
    scheduler actors (srt/ray/scheduler_actor.py) never call ``load_plugins()``, so Ray
    must; ``ray.init(runtime_env={"worker_process_setup_hook":
    "bole_cli.sglang.plugin.ray_worker_setup"})``."""
    from sglang.srt.plugins import load_plugins  # type: ignore[import-not-found]

    load_plugins()


def _stack() -> list[tuple[str, str]]:
    frame, out = sys._getframe(1), []
    while frame is not None:
        out.append((str(frame.f_globals.get("__name__", "")), frame.f_code.co_name))
        frame = frame.f_back
    return out


def process_role(frames: Optional[list[tuple[str, str]]] = None) -> str:
    """"scheduler" where an SGLang scheduler runs (`SCHEDULER_FRAMES` on the stack);
    "other" where SGLang's loader runs without one (launcher, DP controller, detokenizer):
    no hooks there; "direct" when called outside SGLang's loader (tests, embedding)."""
    frames = _stack() if frames is None else frames
    if any(f in SCHEDULER_FRAMES for f in frames):
        return "scheduler"
    return "other" if LOADER_FRAME in frames else "direct"


def uses_ray_launcher(frames: list[tuple[str, str]], argv: list[str]) -> bool:
    """SGLang's Ray launcher: ``--use-ray`` on the command line, or RayEngine on the stack."""
    return (any(a == "--use-ray" or a.startswith("--use-ray=") for a in argv)
            or any(m.startswith("sglang.srt.ray.") for m, _ in frames))


def version_problem(version: Optional[str], source: Any = None) -> str:
    """"" when the plug-in may run on this SGLang version, else why not (one line): 0.5.23,
    or a post release of it whose hooked names and source facts all check out."""
    if version == SGLANG_VERSION:
        return ""
    if not version or not _POST_RELEASE.fullmatch(version):
        return f"SGLang {version or 'of unknown version'}"
    try:
        if source is None:
            from bole_cli.sglang.source import find_sglang_source

            source = find_sglang_source(None, version=version)
        problems = check_plugin_targets(source)
    except Exception as exc:  # noqa: BLE001 - cannot check: stay out
        problems = [f"its source could not be checked ({type(exc).__name__}: {exc})"]
    if not problems:
        return ""
    return f"SGLang {version} ({len(problems)} hook check(s) fail; first: {problems[0]})"


def _activate(version: Optional[str], registry: Any = None, hook_type: Any = None,
              environ: Optional[dict] = None, *, frames: Optional[list[tuple[str, str]]] = None,
              argv: Optional[list[str]] = None, source: Any = None) -> bool:
    env = os.environ if environ is None else environ
    if _state["active"]:
        return True
    if env.get(ENV_DISABLE, "").strip().lower() not in ("", "0", "false", "no"):
        _state["reason"] = f"{ENV_DISABLE} is set"
        logger.warning("Bole plug-in: %s; staying inactive (SGLang runs unchanged)", _state["reason"])
        return False
    if version != SGLANG_VERSION and not (version and _POST_RELEASE.fullmatch(version)):
        return _refuse_version(version, version_problem(version))
    frames = _stack() if frames is None else frames
    if process_role(frames) == "other":
        _state["reason"] = "no SGLang scheduler in this process"
        if uses_ray_launcher(frames, sys.argv if argv is None else argv):
            logger.warning("Bole plug-in: SGLang's Ray launcher: its scheduler actors do not load "
                           "plug-ins, so Bole is inactive there unless Ray runs %s.ray_worker_setup "
                           "as its worker_process_setup_hook (README)", __name__)
        else:
            logger.info("Bole plug-in: no SGLang scheduler in this process; hooks are applied "
                        "in the scheduler processes only")
        return False
    why = version_problem(version, source)
    if why:
        return _refuse_version(version, why)
    if registry is None or hook_type is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore

        registry, hook_type = HookRegistry, HookType
    module = sys.modules[__name__]
    for hook in HOOKS:
        registry.register(hook.target, getattr(module, hook.function), hook_type.AROUND)
    _state.update(active=True, reason="")
    chains = {True: "trees and chains", False: f"trees only ({ENV_CHAINS}=0: chains keep SGLang's path)",
              None: f"trees only ({ENV_CHAINS}={env.get(ENV_CHAINS)!r} is not 1 or 0)"}
    logger.info("Bole plug-in: active on SGLang %s (%d hooks); the verify of Gated DeltaNet layers "
                "uses Bole's closed form and factorised commit for %s", version, len(HOOKS),
                chains[chains_enabled(env.get(ENV_CHAINS))])
    return True


def _refuse_version(version: Optional[str], why: str) -> bool:
    _state["reason"] = why
    logger.warning("Bole plug-in: found %s but Bole is pinned to SGLang %s; staying "
                   "inactive (SGLang runs unchanged; pip install 'bole-cli[serve]')",
                   why if version else "SGLang (version unknown)", SGLANG_VERSION)
    return False


def check_plugin_targets(source: Any = None) -> list[str]:
    """Every name the plug-in hooks or uses, and its source facts, against SGLang's source
    (an SGLangSource, a path, or None for find_sglang_source's search); one line per problem."""
    from bole_cli.sglang.source import SGLangSource, find_sglang_source
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


def largest_verify_batch(reqs: int) -> int:
    """The most requests one verify can carry with `reqs` requests per DP shard: SGLang's
    padded eager batch (get_eager_max_batch_size) or its largest CUDA-graph capture bucket
    (get_cuda_graph_max_batch_size: the pool size rounded up to the capture alignment, x2
    with two-batch overlap, x attention TP when gathered, x attention CP;
    base_cuda_graph_runner.py:83-98). The arena needs one row per request of it, so in a
    scheduler a failure here refuses the plug-in (an arena sized for `reqs` alone would make
    the factor store raise during graph capture); elsewhere (tests) `reqs` is used."""
    common = importlib.import_module("sglang.srt.utils.common")

    sizes = [reqs]
    for name in ("get_eager_max_batch_size", "get_cuda_graph_max_batch_size"):
        try:
            sizes.append(int(getattr(common, name)(reqs)))
        except Exception as exc:  # noqa: BLE001 - SGLang's context not set up (tests)
            if process_role() == "scheduler":
                raise
            _log_once(logging.WARNING, "Bole plug-in: %s(%d) failed (%s); sizing the factor arena "
                      "for %d requests", name, reqs, type(exc).__name__, reqs)
    return max(sizes)


def _max_batch(reqs: int) -> int:
    try:
        return largest_verify_batch(reqs)
    except ImportError:  # SGLang's utils not importable (tests): the requests themselves
        if process_role() == "scheduler":
            raise
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
        num_steps=getattr(spec, "speculative_num_steps", None),
        chains=os.environ.get(ENV_CHAINS),
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


def budget_without_snapshots(original: Callable, cfg: Any, total_rest_memory: float,
                             g: dict) -> tuple[float, int]:
    """(rest without SGLang's snapshot reservation in GiB, mamba slots), after SGLang's own
    sizing has run once (which fixed the slot count in the schedule).

    Runs SGLang's sizing again with that count pinned (a scoped override of the schedule's
    max_mamba_cache_size, times attn_dp_size: the explicit branch divides by it) and
    `_pd_prefill_skips_mamba_spec_state` answering True, so the same slots are charged and
    no snapshots: the difference from the first run is exactly the reservation SGLang made."""
    name = "_pd_prefill_skips_mamba_spec_state"
    gate, schedule = g.get(name), g["get_schedule"]()
    if not callable(gate):
        raise LookupError(f"{name} not found")
    slots = int(schedule.max_mamba_cache_size)
    dp = max(int(getattr(cfg, "attn_dp_size", 1) or 1), 1)
    g[name] = lambda: True
    try:
        with schedule.override(max_mamba_cache_size=slots * dp):
            free = original(cfg, total_rest_memory)
    finally:
        g[name] = gate
    return free, slots


def _around_handle_max_mamba_cache(original: Callable, self: Any, total_rest_memory: float):
    g = _module_globals(original)
    plan, why = configurator_plan(self, g)
    if plan is None:
        _log_once(logging.INFO, "Bole plug-in: SGLang's own speculative state for this model (%s)", why)
        return original(self, total_rest_memory)
    stock = original(self, total_rest_memory)  # SGLang's own sizing; its errors reach the caller
    try:
        free, slots = budget_without_snapshots(original, self, total_rest_memory, g)
    except Exception as exc:  # noqa: BLE001 - SGLang changed: keep its budget (it covers the arena)
        _log_once(logging.WARNING, "Bole plug-in: could not size the budget without snapshots (%s: "
                  "%s); SGLang's snapshot reservation stays in it", type(exc).__name__, exc)
        return stock
    scratch = plan.scratch_bytes()  # trees past one tile: the verify's scratch, one layer at a time
    arena = (plan.arena_bytes() + scratch) / (1 << 30)
    logger.info("Bole plug-in: memory budget without per-node snapshots (%s verify): SGLang's "
                "sizing reserves %s for them (%d mamba slots, as SGLang chose); Bole's factor "
                "arena takes %s (and %s of verify scratch); the KV cache gets %s more than with "
                "SGLang alone", plan.mode, format_bytes((free - stock) * (1 << 30)), slots,
                format_bytes(plan.arena_bytes()), format_bytes(scratch),
                format_bytes((free - arena - stock) * (1 << 30)))
    return free - arena


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
