"""Every SGLang 0.5.23 name the Bole plug-in hooks or reads, in one table, and its source check.

Each `HookTarget` names a dotted path exactly as ``HookRegistry.register`` takes it
(``sglang.srt.plugins.hook_registry``, docs/design.md §6) and the parameter list read from
SGLang 0.5.23's source (``*`` marks the start of keyword-only parameters, ``*args`` /
``**kwargs`` the catch-alls, ``/`` the end of positional-only ones; None: an attribute that
must exist). `check_hook_targets` parses the given SGLang source with `ast` (no import of
sglang) and returns one line per mismatch; `check_plugin_targets` adds `SOURCE_FACTS`, the
texts the hooks rely on. So an SGLang upgrade that moves or re-signs a name is caught before
serving. The function names and `SOURCE_FACTS` pin the text; no line numbers are kept.

use:
- "around": hooked with an AROUND hook (HookType.AROUND: the hook receives SGLang's
  original and ``self``, and calls the original for every pool that is not Bole's);
  `function` names the hook in `bole_cli.sglang.hooks` (`HOOKS` is these rows).
- "wrap": set or replaced for the duration of a call (a class attribute, a module global).
- "call": called or read by the plug-in.
- "global": a global of an SGLang module that a hook reads through the globals of the
  function it wraps (``sizing.configurator_facts``); defined or imported there.
- "alternative": a narrower/wider hook point for the same job, kept checked so the
  plug-in can switch if the primary one changes.
Details: docs/sglang-0.5.23.md.
This module imports only the standard library (and `source`) at import time.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

from bole_cli.sglang.source import SGLangSource, find_sglang_source

_ATTN = "sglang.srt.layers.attention"
_LINEAR = f"{_ATTN}.linear"
_HYBRID = f"{_ATTN}.hybrid_linear_attn_backend"
_KVC = "sglang.srt.mem_cache.kv_cache_configurator"
_MP = "sglang.srt.mem_cache.memory_pool"
_REGISTRY = "sglang.srt.plugins.hook_registry"


@dataclass(frozen=True)
class HookTarget:
    target: str
    use: str  # "around", "wrap", "call" or "alternative" (module docstring)
    params: Optional[tuple[str, ...]]  # None: a class attribute / module global that must exist
    why: str
    function: str = ""  # "around" rows: the AROUND hook in bole_cli.sglang.hooks


SGLANG_TARGETS: tuple[HookTarget, ...] = (
    # ------------------------------------------------------------------ hooked (AROUND)
    HookTarget(
        f"{_KVC}.KVCacheConfigurator._handle_max_mamba_cache", "around",
        ("self", "total_rest_memory"),
        "memory budget: SGLang reserves mamba_cache_per_req * (reqs+1) * D for the snapshots; "
        "without the snapshot buffer that memory goes to the KV cache less the factor arena.",
        "_around_handle_max_mamba_cache",
    ),
    HookTarget(
        f"{_KVC}.KVCacheConfigurator._build_hybrid_req_pool", "around",
        ("self", "*", "max_num_reqs", "extra_max_context_len"),
        "builds HybridReqToTokenPool(mamba_spec_state_size=max_num_reqs, ...): Bole builds it "
        "with a snapshot-free MambaPool.",
        "_around_build_hybrid_req_pool",
    ),
    HookTarget(
        f"{_LINEAR}.gdn_backend.GDNAttnBackend.forward_extend", "around",
        ("self", "layer", "forward_batch", "mixed_qkv", "a", "b", "**kwargs"),
        "target-verify branch: tree conv + verify call; Bole keeps the conv inputs and the "
        "pre-verify conv window before SGLang's tree conv overwrites it.",
        "_around_forward_extend",
    ),
    HookTarget(
        f"{_LINEAR}.gdn_backend.GDNKernelDispatcher.target_verify", "around",
        ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b", "*", "ssm_states",
         "cache_indices", "query_start_loc", "**kwargs"),
        "routes tree verify to TritonGDNKernel even when the verify backend is FlashInfer; "
        "chains (retrieve_parent_token None) go to the configured verify kernel: Bole pools "
        "never reach a snapshotting verify kernel, whichever backend is configured.",
        "_around_target_verify",
    ),
    HookTarget(
        f"{_LINEAR}.kernels.gdn_triton.TritonGDNKernel.target_verify", "around",
        ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b", "*", "ssm_states",
         "cache_indices", "query_start_loc", "intermediate_states_buffer",
         "intermediate_state_indices", "cache_steps", "retrieve_parent_token", "**kwargs"),
        "tree verify in closed form; Bole keeps k/u/log_p instead of snapshots. Gets no "
        "layer id: key per-layer factors by ssm_states.data_ptr() (temporal[layer]).",
        "_around_target_verify",
    ),
    HookTarget(
        f"{_HYBRID}.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify", "around",
        ("self", "last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track",
         "model", "req_pool_indices"),
        "post-verify commit: Eq. 10 from the factors instead of scattering intermediate_ssm, "
        "one conv-window commit for the accepted nodes (and the track slots).",
        "_around_commit",
    ),
    # ------------------------------------------------------------------ set for a call
    HookTarget(
        f"{_MP}.HybridReqToTokenPool.mamba_pool_cls", "wrap", None,
        "class attribute (= MambaPool) used by _init_mamba_pool; set to a MambaPool subclass "
        "that skips intermediate_ssm. A class REPLACE of memory_pool.MambaPool does NOT reach "
        "it (_propagate_patch only rewrites module globals).",
    ),
    HookTarget(
        f"{_MP}.MambaPool.__init__", "wrap",
        ("self", "*", "size", "spec_state_size", "cache_params", "mamba_layer_ids", "device",
         "enable_memory_saver", "speculative_num_draft_tokens", "speculative_eagle_topk",
         "enable_linear_replayssm", "linear_replayssm_cache_len", "envelope_layout",
         "enable_linear_replayssm_spec"),
        "Bole's subclass overrides it: SGLang's allocates intermediate_ssm [layers, "
        "spec_state_size+1, D, HV, V, K] and intermediate_conv_window [.., conv_dim, W-1].",
    ),
    HookTarget(
        f"{_KVC}._pd_prefill_skips_mamba_spec_state", "wrap", (),
        "the budget's 'reserve snapshots?' test; answered True while Bole sizes the budget",
    ),
    # ------------------------------------------------------------------ called or read
    HookTarget(f"{_REGISTRY}.HookRegistry.register", "call",
               ("cls", "target", "hook", "hook_type", "*", "source"),
               "activation registers each AROUND hook"),
    HookTarget(f"{_REGISTRY}.HookRegistry._patched", "call", None,
               "the targets the registry patched (hooks_missing: all or nothing)"),
    HookTarget(f"{_REGISTRY}.HookType.AROUND", "call", None, "the hook type Bole registers"),
    HookTarget("sglang.srt.plugins.load_plugins", "call", (),
               "what ray_worker_setup runs in a Ray scheduler actor"),
    HookTarget(f"{_MP}.HybridReqToTokenPool.mamba2_layer_index", "call", ("self", "layer_id"),
               "model layer id -> pool layer index"),
    HookTarget(f"{_MP}.MambaPool.State.at_layer_idx", "call", ("self", "layer"),
               "per-layer view; Bole's SpeculativeState overrides it"),
    HookTarget(f"{_HYBRID}.HybridLinearAttnBackend._update_ple_state_after_mtp_verify", "call",
               ("self", "state_indices_tensor", "last_correct_step_indices",
                "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"),
               "Qwen4-Exp side states; still run after Bole's commit"),
    HookTarget(f"{_HYBRID}.MambaAttnBackendBase._translate_mamba_indices", "call",
               ("self", "mamba_indices"), "virtual -> physical track slots"),
    HookTarget(f"{_LINEAR}.utils.pp_spec_stable_rows_enabled", "call", (),
               "stable-row pipeline speculation (Bole stays out)"),
    HookTarget("sglang.srt.utils.common.get_eager_max_batch_size", "call", ("max_batch_size",),
               "eager batches may be padded past max running requests: arena rows"),
    HookTarget("sglang.srt.utils.common.get_cuda_graph_max_batch_size", "call",
               ("max_batch_size",),
               "the largest CUDA-graph capture bucket (capture alignment): arena rows"),
    HookTarget("sglang.srt.runtime_context._ConfigBag.override", "call", ("self", "**kwargs"),
               "scoped override: pins max_mamba_cache_size for the budget's second pass"),
    HookTarget("sglang.srt.runtime_context.max_speculative_num_draft_tokens", "call", (),
               "D of the pool"),
    # ------------------------------------------------------------------ the configurator's globals
    *(HookTarget(f"{_KVC}.{name}", "global", None, why) for name, why in (
        ("get_spec", "speculative settings: algorithm, top-k, steps"),
        ("get_memory", "unified memory, page-major layout"),
        ("get_disagg", "PD disaggregation mode and role switch"),
        ("get_exec", "ReplaySSM flags, torch.compile"),
        ("get_schedule", "max running requests, max_mamba_cache_size (and its override)"),
        ("max_speculative_num_draft_tokens", "D of the pool"),
        ("_is_npu", "not an NVIDIA device: Bole stays out"),
        ("_is_hip", "not an NVIDIA device: Bole stays out"),
        ("HybridReqToTokenPool", "the class whose mamba_pool_cls is set while the pool is built"),
    )),
    # ------------------------------------------------------------------ alternatives
    HookTarget(
        f"{_MP}.HybridReqToTokenPool._init_mamba_pool", "alternative",
        ("self", "mamba_size", "mamba_spec_state_size", "cache_params", "mamba_layer_ids",
         "device", "enable_mamba_extra_buffer", "speculative_num_draft_tokens",
         "speculative_eagle_topk", "enable_linear_replayssm", "linear_replayssm_cache_len",
         "mamba_envelope_layout", "enable_linear_replayssm_spec", "short_conv_layer_ids",
         "short_conv_state_shape", "ngram_context_len", "ngram_eos_token_id"),
        "builds self.mamba_pool = self.mamba_pool_cls(...).",
    ),
    HookTarget(
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify",
        "alternative",
        ("mamba_caches", "state_indices_tensor", "last_correct_step_indices",
         "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"),
        "the SSM + conv copy-back called by update_mamba_state_after_mtp_verify (default path).",
    ),
    HookTarget(
        "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify", "alternative",
        ("target_worker", "batch", "accept_lens", "accept_index", "draft_token_num",
         "prepared_step_indices"),
        "caller of the commit; has accept_index / accept_lens (EAGLE, NEXTN, ngram workers).",
    ),
)

# The hooked rows, in registration order.
HOOKS: tuple[HookTarget, ...] = tuple(t for t in SGLANG_TARGETS if t.use == "around")

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


def _module_file(source: SGLangSource, dotted: str) -> tuple[Optional[str], list[str]]:
    """Longest importable module prefix of `dotted` -> (file relpath, remaining qualname)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        base = "/".join(parts[:i])
        for rel in (base + ".py", base + "/__init__.py"):
            if source.exists(rel):
                return rel, parts[i:]
    return None, parts


def _signature_tokens(fn: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> tuple[str, ...]:
    a = fn.args
    out = [x.arg for x in a.posonlyargs]
    if a.posonlyargs:
        out.append("/")
    out += [x.arg for x in a.args]
    if a.vararg is not None:
        out.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        out.append("*")
    out += [x.arg for x in a.kwonlyargs]
    if a.kwarg is not None:
        out.append("**" + a.kwarg.arg)
    return tuple(out)


def _find(body: list[ast.stmt], qual: list[str]) -> Optional[ast.AST]:
    head, rest = qual[0], qual[1:]
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
            if not rest:
                return node
            if isinstance(node, ast.ClassDef):
                return _find(node.body, rest)
            return None
        if not rest and isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == head for t in targets):
                return node
        if not rest and isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == head for alias in node.names):
                return node
    return None


def locate(
    source: SGLangSource, target: str, _trees: Optional[dict[str, ast.Module]] = None
) -> tuple[Optional[str], Optional[ast.AST]]:
    """(file relpath, ast node) of a dotted target in the source; None where not found."""
    rel, qual = _module_file(source, target)
    if rel is None or not qual:
        return rel, None
    trees = {} if _trees is None else _trees
    if rel not in trees:
        trees[rel] = ast.parse(source.read_text(rel), filename=rel)
    return rel, _find(trees[rel].body, qual)


def check_hook_targets(
    source: Union[SGLangSource, str, os.PathLike, None] = None,
    targets: tuple[HookTarget, ...] = SGLANG_TARGETS,
) -> list[str]:
    """Compare `targets` with an SGLang source tree; return one line per mismatch.

    source: an SGLangSource, a path (wheel / unpacked wheel / site dir), or None for
    `find_sglang_source`'s search (any version is accepted: the point is to catch drift).
    An empty list means every target exists with the expected parameter names.
    """
    if not isinstance(source, SGLangSource):
        source = find_sglang_source(source, version=None)
    problems: list[str] = []
    trees: dict[str, ast.Module] = {}
    for t in targets:
        rel, node = locate(source, t.target, trees)
        if rel is None:
            problems.append(f"{t.target}: no module for it in {source.describe()}")
            continue
        if node is None:
            problems.append(f"{t.target}: not defined in {rel}")
            continue
        if t.params is None:
            if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
                problems.append(f"{t.target}: expected an attribute, found a def/class at {rel}:{node.lineno}")
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems.append(f"{t.target}: expected a function at {rel}:{node.lineno}")
            continue
        found = _signature_tokens(node)
        if found != t.params:
            problems.append(
                f"{t.target}: parameters ({', '.join(found)}) at {rel}:{node.lineno}, "
                f"expected ({', '.join(t.params)})"
            )
    return problems


def check_plugin_targets(source: Any = None) -> list[str]:
    """Every name the plug-in hooks or uses, and its source facts, against SGLang's source
    (an SGLangSource, a path, or None for find_sglang_source's search); one line per problem."""
    if not isinstance(source, SGLangSource):
        source = find_sglang_source(source, version=None)
    problems = [f"{h.target}: hooked without a parameter list" for h in HOOKS if h.params is None]
    problems += check_hook_targets(source, SGLANG_TARGETS)
    for rel, text, why in SOURCE_FACTS:
        try:
            body = source.read_text(rel)
        except Exception as exc:  # noqa: BLE001 - report, do not raise
            problems.append(f"{rel}: unreadable ({exc})")
            continue
        if text not in body:
            problems.append(f"{rel}: no longer contains {text!r} ({why})")
    return problems
