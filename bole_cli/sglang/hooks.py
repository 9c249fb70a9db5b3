"""The SGLang 0.5.23 functions the Bole plug-in hooks, as data, and a source check.

Each `HookTarget` names a dotted path exactly as ``HookRegistry.register`` takes it
(``sglang.srt.plugins.hook_registry``, docs/design.md §6) and the parameter list read from
SGLang 0.5.23's source (``*`` marks the start of keyword-only parameters, ``*args`` /
``**kwargs`` the catch-alls, ``/`` the end of positional-only ones). `check_hook_targets`
parses the given SGLang source with `ast` (no import of sglang) and returns one line per
mismatch, so an SGLang upgrade that moves or re-signs a target is caught before serving.

use:
- "around": the plug-in wraps it with an AROUND hook (HookType.AROUND: the hook receives
  SGLang's original and ``self``, and calls the original for every pool that is not Bole's).
- "wrap": the plug-in wraps it (an AROUND hook) or sets it for the duration of a call.
- "alternative": a narrower/wider hook point for the same job, kept checked so the
  plug-in can switch if the primary one changes.
Details and line references: docs/sglang-0.5.23.md.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Optional, Union

from bole_cli.sglang.source import SGLangSource, find_sglang_source


@dataclass(frozen=True)
class HookTarget:
    target: str
    use: str
    params: Optional[tuple[str, ...]]  # None: a class attribute that must exist
    line: int  # where the def / assignment is in 0.5.23 (informative, not checked)
    why: str


_TV = "sglang.srt.layers.attention.linear"

HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget(
        f"{_TV}.kernels.gdn_triton.TritonGDNKernel.target_verify",
        "around",
        ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b", "*", "ssm_states",
         "cache_indices", "query_start_loc", "intermediate_states_buffer",
         "intermediate_state_indices", "cache_steps", "retrieve_parent_token", "**kwargs"),
        217,
        "tree verify (the dispatcher always routes retrieve_parent_token != None here); "
        "Bole computes o with the closed form and keeps k/u/log_p instead of snapshots. "
        "Gets no layer id: key per-layer factors by ssm_states.data_ptr() (temporal[layer]).",
    ),
    HookTarget(
        "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
        "update_mamba_state_after_mtp_verify",
        "around",
        ("self", "last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track",
         "model", "req_pool_indices"),
        1514,
        "post-verify commit: Eq. 10 from the factors instead of scattering intermediate_ssm; "
        "conv windows still scattered from intermediate_conv_window.",
    ),
    HookTarget(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba_pool_cls",
        "wrap",
        None,
        1358,
        "class attribute (= MambaPool) used by _init_mamba_pool; set it to a MambaPool "
        "subclass that skips intermediate_ssm. A class REPLACE of memory_pool.MambaPool does "
        "NOT reach it (_propagate_patch only rewrites module globals).",
    ),
    HookTarget(
        "sglang.srt.mem_cache.memory_pool.MambaPool.__init__",
        "wrap",
        ("self", "*", "size", "spec_state_size", "cache_params", "mamba_layer_ids", "device",
         "enable_memory_saver", "speculative_num_draft_tokens", "speculative_eagle_topk",
         "enable_linear_replayssm", "linear_replayssm_cache_len", "envelope_layout",
         "enable_linear_replayssm_spec"),
        638,
        "allocates intermediate_ssm [layers, spec_state_size+1, D, HV, V, K] (ssm dtype) "
        "and intermediate_conv_window [layers, spec_state_size+1, D, conv_dim, W-1].",
    ),
    HookTarget(
        "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache",
        "wrap",
        ("self", "total_rest_memory"),
        3229,
        "memory budget: reserves mamba_cache_per_req * (reqs+1) * D for the snapshots; "
        "without the snapshot buffer that memory goes to the KV cache.",
    ),
    HookTarget(
        f"{_TV}.gdn_backend.GDNAttnBackend.forward_extend",
        "alternative",
        ("self", "layer", "forward_batch", "mixed_qkv", "a", "b", "**kwargs"),
        948,
        "target-verify branch: tree conv + verify call; asserts intermediate_ssm is not None "
        "(gdn_backend.py:1143), so a pool without snapshots needs a placeholder or this hook.",
    ),
    HookTarget(
        f"{_TV}.gdn_backend.GDNKernelDispatcher.target_verify",
        "alternative",
        ("self", "A_log", "dt_bias", "q", "k", "v", "a", "b", "*", "ssm_states",
         "cache_indices", "query_start_loc", "**kwargs"),
        466,
        "routes tree verify to TritonGDNKernel even when the verify backend is FlashInfer; "
        "chains (retrieve_parent_token None) go to the configured verify kernel, so Bole's "
        "hook sits here too.",
    ),
    HookTarget(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool",
        "alternative",
        ("self", "mamba_size", "mamba_spec_state_size", "cache_params", "mamba_layer_ids",
         "device", "enable_mamba_extra_buffer", "speculative_num_draft_tokens",
         "speculative_eagle_topk", "enable_linear_replayssm", "linear_replayssm_cache_len",
         "mamba_envelope_layout", "enable_linear_replayssm_spec", "short_conv_layer_ids",
         "short_conv_state_shape", "ngram_context_len", "ngram_eos_token_id"),
        1426,
        "builds self.mamba_pool = self.mamba_pool_cls(...).",
    ),
    HookTarget(
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify",
        "alternative",
        ("mamba_caches", "state_indices_tensor", "last_correct_step_indices",
         "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"),
        781,
        "the SSM + conv copy-back called by update_mamba_state_after_mtp_verify (default path).",
    ),
    HookTarget(
        "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify",
        "alternative",
        ("target_worker", "batch", "accept_lens", "accept_index", "draft_token_num",
         "prepared_step_indices"),
        1005,
        "caller of the commit; has accept_index / accept_lens (EAGLE, NEXTN, ngram workers).",
    ),
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
    targets: tuple[HookTarget, ...] = HOOK_TARGETS,
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
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
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
