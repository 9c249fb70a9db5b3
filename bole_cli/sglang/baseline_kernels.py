"""SGLang 0.5.23's GDN Triton kernels, loaded alone (docs/design.md §6).

`load_sglang_kernels` finds the source (`bole_cli.sglang.source`), imports the kernel
modules under `bole_cli.sglang.isolation` (no SGLang ``__init__``) and returns their
callables as one `SGLangKernels`. Inside a live SGLang process (real ``sglang`` already
imported) the real modules are imported normally instead.

Adding a kernel: name its module below, list the callables it provides in
`KERNEL_FUNCTIONS` and give `SGLangKernels` a field of the same name (tests check the two
agree); a module outside the extracted folders also goes into `bole_cli.sglang.source`.

Facts about the loaded kernels (signatures, layouts, dtypes, which ReplaySSM protocol a
model gets): docs/sglang-0.5.23.md. Nothing heavy is imported at module level.

ReplaySSM (chain verify without snapshots) has two protocols in 0.5.23, both wrapped here
with the arguments SGLang passes: the *circular ring* a GDN model (Qwen3.5, Qwen3-Next)
runs (`replayssm_ring_*`), and the *fold* that only KDA models run (`replayssm_fold*`,
`replayssm_verify`), kept as a second, labelled baseline.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from bole_cli.errors import BoleError
from bole_cli.sglang.isolation import isolated_sglang, live_sglang
from bole_cli.sglang.source import SGLANG_VERSION, SGLangSource, find_sglang_source
from bole_cli.sglang.triton_interpreter import (
    fix_interpreted_bf16_dot,
    fix_interpreted_loop_counters,
    fix_interpreted_math_aliases,
    fix_interpreted_sm_count,
    fix_triton_interpreter_masks,
)

# The modules `load_sglang_kernels` imports (dotted names inside SGLang 0.5.23).
VERIFY_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
DECODE_MODULE = "sglang.kernels.ops.attention.fla.fused_recurrent"
CONV_MODULE = "sglang.kernels.ops.mamba.causal_conv1d_triton"
SCATTER_MODULE = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"
GATING_MODULE = "sglang.kernels.ops.attention.linear.fused_gdn_gating"
FOLD_MODULE = "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_fold"
RING_MODULE = "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode"
WRAPPER_MODULE = "sglang.srt.layers.attention.linear.kernels.gdn_triton"
# the gated RMSNorm a Qwen3.5 GDN layer applies after its decode (loaded with_norm: needs einops)
NORM_MODULE = "sglang.kernels.ops.attention.fla.layernorm_gated"

#: Kernel module -> the callables `SGLangKernels` takes from it (one field each), in
#: import order.
KERNEL_FUNCTIONS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    VERIFY_MODULE: ("fused_sigmoid_gating_delta_rule_update",),
    DECODE_MODULE: ("fused_recurrent_gated_delta_rule_packed_decode",),
    CONV_MODULE: ("causal_conv1d_update",),
    SCATTER_MODULE: ("fused_mamba_state_scatter_with_mask", "fused_conv_window_scatter_with_mask",
                     "scatter_mamba_states_after_mtp_verify"),
    GATING_MODULE: ("fused_gdn_gating",),
    FOLD_MODULE: ("commit_gdn_replayssm_fold_all_layers",),
    RING_MODULE: ("gdn_replayssm_spec_decode", "commit_gdn_replayssm_spec", "commit_gdn_replayssm_circular"),
})
KERNEL_MODULES = tuple(KERNEL_FUNCTIONS)
# Light real modules those import whose parent package __init__ is heavy (stubbed parents).
DEPENDENCY_MODULES = ("sglang.kernels.ops.memory.ptr_table",)
#: SGLang's default --linear-replayssm-cache-len (the ring length L, a power of two).
RING_DEFAULT_LEN = 16


def ring_len_for(draft_tokens: int) -> int:
    """The ring length Bole runs SGLang's ReplaySSM with for a window of `draft_tokens`:
    SGLang's default (16), raised to the smallest power of two that holds the window (for
    longer chains a user must raise --linear-replayssm-cache-len; 0.5.23 checks nothing
    for GDN, and a window past the ring's end is dropped). docs/sglang-0.5.23.md."""
    return max(RING_DEFAULT_LEN, 1 << max(0, draft_tokens - 1).bit_length())


@dataclass(frozen=True)
class SGLangKernels:
    """SGLang 0.5.23's GDN verify / conv / commit kernels, loaded alone.

    Callables (signatures in docs/sglang-0.5.23.md):
    - fused_sigmoid_gating_delta_rule_update: the serial (tree) verify kernel wrapper.
    - fused_recurrent_gated_delta_rule_packed_decode: the one-token decode CUDA runs (the
      Triton dispatcher's packed decode: q/k/v read from the conv's output, gates, recurrence).
    - causal_conv1d_update: conv update; with retrieve_next_token/sibling it is the tree
      conv, and it also FILLS retrieve_parent_token for the verify kernel.
    - fused_gdn_gating: g, beta from A_log, a, b, dt_bias (prefill path; [1, T, HV] fp32).
    - fused_mamba_state_scatter_with_mask / fused_conv_window_scatter_with_mask /
      scatter_mamba_states_after_mtp_verify: the accepted-snapshot copy-back (CUDA/XPU only;
      `copy_back_accepted` falls back to SGLang's torch indexing on other devices).
    - commit_gdn_replayssm_fold_all_layers: ReplaySSM's KDA-protocol commit, replaying each
      request's accepted prefix from the raw-input window into the state (`replayssm_fold`).
    - gdn_replayssm_spec_decode / commit_gdn_replayssm_spec / commit_gdn_replayssm_circular:
      ReplaySSM's GDN protocol, the circular ring (`replayssm_ring_verify`,
      `replayssm_ring_commit`).
    - TritonGDNKernel: the wrapper class, only with ``with_wrapper=True``.
    - layernorm_fn: the gated RMSNorm after the decode (``RMSNormGated``'s forward), only
      with ``with_norm=True``.
    """

    version: Optional[str]
    source: SGLangSource
    isolated: bool
    fused_sigmoid_gating_delta_rule_update: Callable[..., Any]
    fused_recurrent_gated_delta_rule_packed_decode: Callable[..., Any]
    causal_conv1d_update: Callable[..., Any]
    fused_gdn_gating: Callable[..., Any]
    fused_mamba_state_scatter_with_mask: Callable[..., Any]
    fused_conv_window_scatter_with_mask: Callable[..., Any]
    scatter_mamba_states_after_mtp_verify: Callable[..., Any]
    commit_gdn_replayssm_fold_all_layers: Callable[..., Any]
    gdn_replayssm_spec_decode: Callable[..., Any]
    commit_gdn_replayssm_spec: Callable[..., Any]
    commit_gdn_replayssm_circular: Callable[..., Any]
    TritonGDNKernel: Optional[type] = None
    layernorm_fn: Optional[Callable[..., Any]] = None
    modules: Mapping[str, types.ModuleType] = field(default_factory=dict)

    def target_verify(
        self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
        intermediate_states_buffer, intermediate_state_indices, cache_steps,
        retrieve_parent_token, **_ignored,
    ):
        """Exactly what ``TritonGDNKernel.target_verify`` does in 0.5.23 (docs/sglang-0.5.23.md (a))."""
        return self.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
            initial_state_source=ssm_states, initial_state_indices=cache_indices,
            cu_seqlens=query_start_loc, use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
            disable_state_update=True,
            intermediate_states_buffer=intermediate_states_buffer,
            intermediate_state_indices=intermediate_state_indices,
            cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token,
        )

    # ---- ReplaySSM, the fold (KDA's protocol in 0.5.23; a second baseline for GDN shapes) ----

    @staticmethod
    def replayssm_rings(state, tokens_per_request: int, key_heads: int, act_dtype) -> dict:
        """Empty windows of the FOLD protocol (KDA's) for a state pool [L, S, HV, V, K]
        (L GDN layers): per layer and slot the raw v [HV, RL, V] and pre-norm k [H, RL, K]
        in the activation dtype, g and beta [HV, RL] float32, RL = draft tokens per request
        (docs/sglang-0.5.23.md, "ReplaySSM"; uninitialised: the verify writes every entry
        the fold reads). `replayssm_verify` takes one layer's slice."""
        import torch

        layers, slots, hv, vd, kd = state.shape
        kw = dict(device=state.device)
        return {
            "replayssm_rawv": torch.empty(layers, slots, hv, tokens_per_request, vd, dtype=act_dtype, **kw),
            "replayssm_rawk": torch.empty(layers, slots, key_heads, tokens_per_request, kd, dtype=act_dtype,
                                          **kw),
            "replayssm_g": torch.empty(layers, slots, hv, tokens_per_request, dtype=torch.float32, **kw),
            "replayssm_beta": torch.empty(layers, slots, hv, tokens_per_request, dtype=torch.float32, **kw),
        }

    def replayssm_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices,
                         query_start_loc, rings: Mapping[str, Any]):
        """The FOLD protocol's verify (KDA's), exactly as
        ``GDNAttnBackend._replayssm_fold_target_verify`` calls its Triton branch: the recurrent kernel
        with the state frozen and each token's raw v, k, g, beta written to `rings`
        (`replayssm_rings(...)` of one layer: each ring indexed [layer]). q, k [1, N, H, K];
        v [1, N, HV, V]; a, b [N, HV]; ssm_states [S, HV, V, K]."""
        return self.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b,
            initial_state_source=ssm_states, initial_state_indices=cache_indices,
            cu_seqlens=query_start_loc, use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0, softplus_threshold=20.0, is_kda=False,
            disable_state_update=True, cache_ring=True, **rings,
        )

    def replayssm_fold(self, state, rings: Mapping[str, Any], state_indices, accept_lens) -> None:
        """The FOLD protocol's commit (KDA's): replay each request's first accept_lens[b]
        window entries (accepted drafts + the bonus position) into the state, every layer
        in one launch, with the arguments ``commit_gdn_replayssm_fold_after_verify`` passes
        (no prefix-cache track slots). state [L, S, HV, V, K]; each window with the same
        leading layer dimension."""
        self.commit_gdn_replayssm_fold_all_layers(
            checkpoint_state=state,
            rawv_cache=rings["replayssm_rawv"], rawk_cache=rings["replayssm_rawk"],
            g_cache=rings["replayssm_g"], beta_cache=rings["replayssm_beta"],
            ssm_state_indices=state_indices, accept_lens=accept_lens,
            max_cache_len=rings["replayssm_rawv"].shape[-2],
            num_k_heads=rings["replayssm_rawk"].shape[2], null_block_id=-1,
        )

    # ---- ReplaySSM, the circular ring (what a GDN model runs in 0.5.23) ---------------------

    @staticmethod
    def replayssm_ring(state, rows: int, key_heads: int, ring_dtype, cache_len: int = RING_DEFAULT_LEN) -> dict:
        """Zeroed circular-ring buffers of a GDN pool `state` [L, S, HV, V, K], as MambaPool
        allocates them under ``--enable-linear-replayssm-spec`` (docs/sglang-0.5.23.md,
        "ReplaySSM"): per layer and request row the update vectors replayssm_d
        [HV, Lr, V] and L2-normalised keys replayssm_k [H, Lr, K] in `ring_dtype` (SGLang:
        the conv dtype, bf16 by default), log decays replayssm_g [HV, Lr] float32, and for a
        16-bit ring their low parts replayssm_rawv / replayssm_rawk (else None); per row
        the cursors write_pos, cache_base (int32) and is_flush (int8), shared by all
        layers. Lr = cache_len (a power of two, at least the draft window). `rows`: request
        rows (SGLang: max running requests + 1), indexed by the verify's replay_indices."""
        import torch

        if cache_len < 1 or cache_len & (cache_len - 1):
            raise BoleError(f"ReplaySSM ring length {cache_len} is not a power of two")
        layers, _, hv, vd, kd = state.shape
        kw = dict(device=state.device)
        low = ring_dtype != torch.float32
        return {
            "replayssm_d": torch.zeros(layers, rows, hv, cache_len, vd, dtype=ring_dtype, **kw),
            "replayssm_k": torch.zeros(layers, rows, key_heads, cache_len, kd, dtype=ring_dtype, **kw),
            "replayssm_g": torch.zeros(layers, rows, hv, cache_len, dtype=torch.float32, **kw),
            "replayssm_rawv": torch.zeros(layers, rows, hv, cache_len, vd, dtype=ring_dtype, **kw) if low else None,
            "replayssm_rawk": torch.zeros(layers, rows, key_heads, cache_len, kd, dtype=ring_dtype, **kw)
            if low else None,
            "write_pos": torch.zeros(rows, dtype=torch.int32, **kw),
            "cache_base": torch.zeros(rows, dtype=torch.int32, **kw),
            "is_flush": torch.zeros(rows, dtype=torch.int8, **kw),
        }

    @staticmethod
    def ring_layer(ring: Mapping[str, Any], layer: int) -> dict:
        """One GDN layer's view of `replayssm_ring(...)` (the cursors are shared)."""
        return {name: (t[layer] if name.startswith("replayssm_") and t is not None else t)
                for name, t in ring.items()}

    def replayssm_ring_verify(self, A_log, dt_bias, query, key, value, a, b, *, checkpoint_state,
                              ring: Mapping[str, Any], cache_indices, replay_indices, query_start_loc,
                              draft_token_num: int):
        """The circular ring's verify for one GDN layer, exactly as
        ``GDNAttnBackend._replayssm_target_verify`` calls it: o of every draft position
        from the frozen checkpoint [S, HV, V, K] plus the ring's committed history, and
        this window's d, k, g written at the ring positions after the history (the
        cursors are only read). query/key [1, N, H, K] or [N, H, K]; value [.., N, HV, V];
        a, b [N, HV]; `ring`: `ring_layer(...)`; cache_indices: pool slots; replay_indices:
        ring rows (SGLang: req_pool_indices). Returns o shaped like `value`."""
        H, K = key.shape[-2], key.shape[-1]
        HV, V = value.shape[-2], value.shape[-1]
        seq_len = query.numel() // (H * K)
        out = query.new_empty(seq_len, HV, V)
        self.gdn_replayssm_spec_decode(
            q=query.reshape(seq_len, H, K), k=key.reshape(seq_len, H, K), v=value.reshape(seq_len, HV, V),
            a=a.reshape(seq_len, HV), b=b.reshape(seq_len, HV), A_log=A_log, dt_bias=dt_bias,
            checkpoint_state=checkpoint_state, d_cache=ring["replayssm_d"], k_cache=ring["replayssm_k"],
            g_cache=ring["replayssm_g"], rawv_cache=ring["replayssm_rawv"], rawk_cache=ring["replayssm_rawk"],
            beta_cache=None, out=out, query_start_loc=query_start_loc, ssm_state_indices=cache_indices,
            replay_indices=replay_indices, write_pos=ring["write_pos"], cache_base=ring["cache_base"],
            is_flush=ring["is_flush"], max_cache_len=ring["replayssm_d"].shape[-2],
            max_spec_len=draft_token_num, scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
            null_block_id=-1, launch_mode="verify",
        )
        return out.reshape(value.shape)

    def replayssm_ring_commit(self, state, ring: Mapping[str, Any], state_indices, replay_indices, accept_lens,
                              draft_token_num: int) -> None:
        """The circular ring's commit, as ``commit_mamba_states_after_verify`` runs it for a
        GDN model (no prefix-cache track slots; the conv-window scatter is left out):
        advance each row's cursors by accept_lens[b] (accepted drafts + the bonus token; 0
        commits nothing), then materialise, all layers in one launch, the rows whose ring
        is due: every commit with a 16-bit pool, else when the next window could overflow
        it. state [L, S, HV, V, K]; `ring` the whole `replayssm_ring(...)`."""
        import torch

        self.commit_gdn_replayssm_spec(
            write_pos=ring["write_pos"], cache_base=ring["cache_base"], is_flush=ring["is_flush"],
            num_accepted=accept_lens, replay_indices=replay_indices,
            max_cache_len=ring["replayssm_d"].shape[-2], max_spec_len=draft_token_num,
            fold_every_commit=state.dtype != torch.float32, null_block_id=-1,
        )
        self.commit_gdn_replayssm_circular(
            checkpoint_state=state, d_cache=ring["replayssm_d"], k_cache=ring["replayssm_k"],
            g_cache=ring["replayssm_g"], d_residual_cache=ring["replayssm_rawv"],
            k_residual_cache=ring["replayssm_rawk"], state_batch_indices=state_indices,
            replay_indices=replay_indices, write_pos=ring["write_pos"], cache_base=ring["cache_base"],
            is_flush=ring["is_flush"], accept_lens=accept_lens, mamba_track_indices=None,
            mamba_steps_to_track=None, null_block_id=-1,
        )

    def replayssm_ring_materialize(self, state, ring: Mapping[str, Any], state_indices, replay_indices) -> None:
        """Fold every row's committed ring history into `state` now and empty the ring, with
        SGLang's own materialisation (the circular commit with every row due and nothing
        newly accepted). Not a step SGLang takes on its own: the bench and the tests use it
        on copies to read the committed state a ring holds implicitly."""
        import torch

        ring["is_flush"][replay_indices.long()[state_indices >= 0]] = 1  # padding rows stay as they are
        self.commit_gdn_replayssm_circular(
            checkpoint_state=state, d_cache=ring["replayssm_d"], k_cache=ring["replayssm_k"],
            g_cache=ring["replayssm_g"], d_residual_cache=ring["replayssm_rawv"],
            k_residual_cache=ring["replayssm_rawk"], state_batch_indices=state_indices,
            replay_indices=replay_indices, write_pos=ring["write_pos"], cache_base=ring["cache_base"],
            is_flush=ring["is_flush"],
            accept_lens=torch.zeros(state_indices.shape[0], dtype=torch.int32, device=state.device),
            mamba_track_indices=None, mamba_steps_to_track=None, null_block_id=-1,
        )

    def copy_back_accepted(self, dst, src, dst_indices, step_indices, src_indices=None) -> None:
        """dst[:, dst_indices[i]] = src[:, src_indices[i], step_indices[i]] for step >= 0.

        Mirrors HybridLinearAttnBackend._scatter_speculative_state_with_mask (docs/sglang-0.5.23.md
        (b)): the fused Triton scatter on CUDA, SGLang's
        own torch indexing elsewhere. dst [layers, slots, ...]; src [layers, rows, steps, ...];
        src_indices default to arange (scratch row = batch position).
        """
        import torch

        if dst is None or src is None or step_indices.numel() == 0:
            return
        if dst.is_cuda and src.is_cuda:
            self.fused_mamba_state_scatter_with_mask(dst, src, dst_indices, step_indices, src_indices)
            return
        device = dst.device
        dsti = dst_indices.to(device=device, dtype=torch.long)
        steps = step_indices.to(device=device, dtype=torch.long)
        srci = (
            torch.arange(steps.shape[0], device=device, dtype=torch.long)
            if src_indices is None
            else src_indices.to(device=device, dtype=torch.long)
        )
        valid = (
            (steps >= 0) & (steps < src.shape[2]) & (dsti >= 0) & (dsti < dst.shape[1])
            & (srci < src.shape[1])
        )
        rows = valid.nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            return
        dst[:, dsti[rows]] = src[:, srci[rows], steps[rows]]


_LOCK = threading.Lock()
_CACHE: dict[tuple, SGLangKernels] = {}


def load_sglang_kernels(
    wheel_or_site_dir: Optional[os.PathLike | str] = None,
    *,
    version: Optional[str] = SGLANG_VERSION,
    with_wrapper: bool = False,
    with_norm: bool = False,
    fix_interpreter: bool = True,
) -> SGLangKernels:
    """Load SGLang's GDN Triton kernel modules without SGLang's top-level ``__init__``.

    wheel_or_site_dir: a ``.whl``, an unpacked wheel / site-packages folder, or a folder
    holding the wheel; default: `find_sglang_source`'s search. with_wrapper: also load
    ``gdn_triton.TritonGDNKernel`` (needs einops and the fla chunk kernels importable);
    with_norm: also the gated RMSNorm's ``layernorm_fn`` (needs einops).
    Set TRITON_INTERPRET=1 before calling to get interpreter (CPU) kernels; the result is
    cached per (source, interpreter mode). Under the interpreter, fix_interpreter applies
    `fix_triton_interpreter_masks` and `fix_interpreted_bf16_dot` (process-wide) so SGLang's
    conv kernel and ReplaySSM's bf16 ring run on CPU.
    """
    live = live_sglang() is not None
    source = find_sglang_source(wheel_or_site_dir, version=version)
    names = KERNEL_MODULES + ((WRAPPER_MODULE,) if with_wrapper else ()) + ((NORM_MODULE,) if with_norm else ())
    if live and wheel_or_site_dir is None:
        root, isolated = source.path, False
    else:
        root, isolated = source.package_root(), True
    key = (str(root), isolated, with_wrapper, with_norm, os.environ.get("TRITON_INTERPRET", ""))
    with _LOCK:
        if key in _CACHE:
            if fix_interpreter:
                fix_triton_interpreter_masks()
                fix_interpreted_bf16_dot()
            return _CACHE[key]
        try:
            import torch  # noqa: F401 - fail here with a clear message rather than mid-import
            import triton  # noqa: F401
        except ImportError as exc:
            raise BoleError(f"loading SGLang's kernels needs torch and triton: {exc}") from exc
        if fix_interpreter:
            fix_triton_interpreter_masks()
            fix_interpreted_bf16_dot()
        modules: dict[str, types.ModuleType] = {}
        current = None
        try:
            with isolated_sglang(root, names + DEPENDENCY_MODULES) if isolated else contextlib.nullcontext():
                for current in names:
                    modules[current] = importlib.import_module(current)
        except Exception as exc:  # noqa: BLE001 - one clear line for the CLI
            raise BoleError(
                f"could not load {current} from {source.describe()}: {type(exc).__name__}: {exc}"
            ) from exc
        for name, fix in ((FOLD_MODULE, fix_interpreted_loop_counters), (RING_MODULE, fix_interpreted_loop_counters),
                          (DECODE_MODULE, fix_interpreted_math_aliases), (NORM_MODULE, fix_interpreted_sm_count)):
            if name in modules:  # each module's interpreter fix (a no-op on the GPU)
                fix(modules[name])
        kernels = SGLangKernels(
            version=source.version, source=source, isolated=isolated,
            **{name: getattr(modules[module], name)
               for module, provided in KERNEL_FUNCTIONS.items() for name in provided},
            TritonGDNKernel=getattr(modules.get(WRAPPER_MODULE), "TritonGDNKernel", None),
            layernorm_fn=getattr(modules.get(NORM_MODULE), "layernorm_fn", None),
            modules=types.MappingProxyType(modules),
        )
        _CACHE[key] = kernels
        return kernels
