"""The Bole plug-in's AROUND hooks on SGLang 0.5.23 (registered by `plugin.activate`; their
targets are the "around" rows of `targets.SGLANG_TARGETS`, docs/design.md §6).

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
   Bole's closed form with SGLang's gates / l2norm / scale, without its factors; k, v, g,
   beta go to the arena (the replay commit's inputs).
   Parents come from SGLang's retrieve_parent_token (trees); a chain has none (its verify
   metadata carries no retrive_* tensors), so its parents are 0..D-2.
   Other pools: SGLang's code, arguments untouched.
5. ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``: on a Bole pool, one
   tree_commit_replay over all GDN layers + one conv-window commit for the accepted nodes, and
   the same for the prefix-cache track slots; SGLang's PLE side-state update still runs.

Every hook calls SGLang's original, arguments untouched, for a pool that is not Bole's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from bole_cli.memory import GiB, format_bytes
from bole_cli.sglang import process
from bole_cli.sglang import sizing


def _module_globals(fn: Callable) -> dict:
    """The globals of the module defining `fn`, through other plug-ins' wrappers."""
    import inspect

    return inspect.unwrap(fn).__globals__


def _around_handle_max_mamba_cache(original: Callable, self: Any, total_rest_memory: float):
    sglang_globals = _module_globals(original)
    plan, why = sizing.configurator_plan(self, sglang_globals)
    if plan is None:
        process.log_once(logging.INFO, "Bole plug-in: SGLang's own speculative state for this model (%s)", why)
        return original(self, total_rest_memory)
    stock = original(self, total_rest_memory)  # SGLang's own sizing; its errors reach the caller
    try:
        free, slots = sizing.budget_without_snapshots(original, self, total_rest_memory, sglang_globals)
    except Exception as exc:  # noqa: BLE001 - SGLang changed: keep its budget (it covers the arena)
        process.log_once(logging.WARNING, "Bole plug-in: could not size the budget without snapshots (%s: "
                  "%s); SGLang's snapshot reservation stays in it", type(exc).__name__, exc)
        return stock
    scratch = plan.scratch_bytes()  # trees past one tile: the verify's scratch, one layer at a time
    arena = (plan.arena_bytes() + scratch) / GiB
    process.logger.info("Bole plug-in: memory budget without per-node snapshots (%s verify): SGLang's "
                "sizing reserves %s for them (%d mamba slots, as SGLang chose); Bole's factor "
                "arena takes %s (and %s of verify scratch); the KV cache gets %s more than with "
                "SGLang alone", plan.mode, format_bytes((free - stock) * GiB), slots,
                format_bytes(plan.arena_bytes()), format_bytes(scratch),
                format_bytes((free - arena - stock) * GiB))
    return free - arena


def _around_build_hybrid_req_pool(original: Callable, self: Any, *args: Any, **kwargs: Any):
    sglang_globals = _module_globals(original)
    plan, why = sizing.configurator_plan(self, sglang_globals)
    pool_cls_owner = sglang_globals.get("HybridReqToTokenPool")
    if plan is None or pool_cls_owner is None:
        process.log_once(logging.INFO, "Bole plug-in: SGLang's own speculative state for this model (%s)",
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
