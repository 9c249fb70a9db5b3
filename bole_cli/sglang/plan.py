"""When the Bole plug-in takes over an SGLang pool, and how big its factor arena is.

Torch-free and SGLang-free: the plug-in's hooks gather plain facts from SGLang's
configurator (`sizing.configurator_facts`), and `decide` turns them into a `BolePlan`
or the one reason Bole stays out of the way. `bole serve --dry-run` uses the same byte
arithmetic without importing anything heavy.

Trees (``--speculative-eagle-topk > 1``) and chains (top-k 1, or unset: SGLang's own
meaning of a linear draft) both get a plan: a chain is the tree whose parents are
0..D-2, verified by the same kernels. ``BOLE_CHAINS=0`` leaves chains to SGLang, and so
does ``--enable-linear-replayssm-spec`` (SGLang's snapshot-free chain verify: its sizing
and pool stay untouched). docs/design.md §6.

The arena (bole_cli/sglang/factors.py) replaces SGLang's per-node snapshots
(MambaPool.intermediate_ssm [L, rows, D, HV, V, K] in the state dtype) and per-node
conv windows (intermediate_conv_window [L, rows, D, conv_dim, W-1], dense for trees; for
CUDA chains SGLang stores one deduplicated [conv_dim, D + W - 2] window per row, in
MambaPool.__init__):

    per GDN layer and draft-token position (rows x D positions):
        k      [H, K]        activation dtype   (raw; l2-normalised in the kernels)
        u      [HV, V]       float32
        log_p  [HV]          float32
        x      [conv_dim]    conv-state dtype   (the conv inputs, for the conv commit)
    per GDN layer and row:
        conv_prev [conv_dim, W-1]  conv-state dtype (the committed window before verify:
                                   SGLang's verify conv, tree or chain, overwrites it)
    shared: parents [rows x D] int32, clamped slots [rows] int32, chain template [D].

rows = the largest batch a verify can carry + 1, like SGLang's `spec_state_size + 1`: the
max running requests per DP shard, or more where SGLang pads them: its eager batch
(get_eager_max_batch_size) or its largest CUDA-graph capture bucket (the pool size rounded
up to get_cuda_graph_batch_size_alignment; `sizing.largest_verify_batch`). A bucket larger
than the arena would make the factor store raise during capture.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from bole_cli import env
from bole_cli.limits import (KERNEL_STATE_DTYPES, MAX_TILE_NODES, MAX_TREE_NODES, PLUGIN_VERIFY_PRECISIONS,
                             SERVED_VERIFY_PRECISION)
from bole_cli.memory import (FLOAT_DTYPES, canonical_dtype, conv_window_bytes, factor_bytes,
                             state_snapshot_bytes)

# The speculative algorithms whose verify runs SGLang's EAGLE tree path (NEXTN is an alias
# of EAGLE inside SGLang). NGRAM / STANDALONE / DFLASH / DSPARK are left alone.
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
# The plug-in serves SGLang's own speculative-decoding contract (docs/design.md §9): the
# verify's dots at the kernels' choice (tf32 for 16-bit activations: outputs at the bf16
# rounding floor) and the replay commit (the committed state exact to float32).
# BOLE_VERIFY_PRECISION=tf32x3 (or ieee) opts into float32-exact verify outputs, at a cost.
DEFAULT_PRECISION = SERVED_VERIFY_PRECISION
ENV_DISABLE = env.DISABLE
ENV_PRECISION = env.VERIFY_PRECISION
# BOLE_CHAINS=0 leaves top-k 1 (chain) verifies to SGLang; unset or 1: Bole takes them.
ENV_CHAINS = env.CHAINS


def chains_enabled(value: Optional[str]) -> Optional[bool]:
    """BOLE_CHAINS's value: True (unset, 1, true, yes, on), False (0, false, no, off),
    None for anything else (the plug-in then refuses chains, naming the value)."""
    return env.flag(value, True)


def is_chain(topk: Any) -> bool:
    """SGLang's linear draft: --speculative-eagle-topk unset (None) or at most 1
    (HybridLinearAttnBackend reads ``topk or 0``; chains are ``topk <= 1``)."""
    return topk is None or (isinstance(topk, int) and not isinstance(topk, bool) and topk <= 1)


def verify_precision(value: Optional[str]) -> Optional[str]:
    """BOLE_VERIFY_PRECISION's value, or the plug-in's default (None: the kernels' choice)."""
    return (value or "").strip().lower() or DEFAULT_PRECISION


@dataclass(frozen=True)
class BolePlan:
    """The shapes of one rank's Bole arena (per tensor-parallel shard)."""

    layers: int  # GDN layers held by this pool
    key_heads: int  # H (per tensor-parallel shard)
    key_dim: int  # K
    value_heads: int  # HV (per tensor-parallel shard)
    value_dim: int  # V
    conv_dim: int  # 2*H*K + HV*V (per tensor-parallel shard)
    conv_window: int  # W - 1
    draft_tokens: int  # D (SGLang's max_speculative_num_draft_tokens)
    rows: int  # largest verify batch + 1
    act_dtype: str
    conv_dtype: str
    ssm_dtype: str
    precision: Optional[str] = DEFAULT_PRECISION  # tree_verify's dots; None: the kernels' choice
    chain: bool = False  # top-k 1: every request's D tokens form one chain
    # The drafter's tree depth (--speculative-num-steps: each draft step adds one level
    # below the root), the verify's max_depth promise for trees; None: not known.
    draft_steps: Optional[int] = None

    @property
    def mode(self) -> str:
        return "chain" if self.chain else "tree"

    @property
    def tokens(self) -> int:
        return self.rows * self.draft_tokens

    def node_bytes_per_layer(self) -> int:
        """Arena bytes per draft-token position and GDN layer."""
        act, conv = FLOAT_DTYPES[self.act_dtype], FLOAT_DTYPES[self.conv_dtype]
        return (factor_bytes(self.key_heads, self.key_dim, self.value_heads, self.value_dim,
                             k_bytes=act, v_bytes=act, scalars=2) + self.conv_dim * conv)

    def arena_bytes(self) -> int:
        conv = FLOAT_DTYPES[self.conv_dtype]
        per_row = conv_window_bytes(self.conv_dim, self.conv_window, conv)
        # + one layer's verify factors (u, log_p), which the replay commit does not keep
        return (self.layers * (self.tokens * self.node_bytes_per_layer() + self.rows * per_row)
                + self.tokens * factor_bytes(0, 0, self.value_heads, self.value_dim)
                + 4 * (self.tokens + self.rows + self.draft_tokens))

    def depth_promise(self, width: int, tree: bool) -> Optional[int]:
        """tree_verify's max_depth for a verify of `width` tokens a request: trees are at most
        `draft_steps` deep (SGLang's draft tree: a level per step), chains width - 1 (the
        dummy runs of trees are chains too); None where nothing is known or the promise would
        be out of the kernels' range. It lets shallow big trees take the level kernel and
        spares the chain kernels' launches (docs/design.md §3)."""
        depth = width - 1
        if tree:
            if self.draft_steps is None:
                return None
            depth = min(depth, self.draft_steps)
        return depth if 0 <= depth < MAX_TREE_NODES else None

    def scratch_bytes(self) -> int:
        """The big-tree verify's scratch while one layer verifies (trees past one tile take
        the blocked kernel's SPLIT parts and, with no depth promised, the chain kernels'
        factors too: docs/design.md §3): reserved beside the arena, at the largest verify
        batch, D nodes a request promised as factors.py launches it. No depth promise: the
        dummy runs of trees verify D-token chains, so the chain factors count too."""
        if self.draft_tokens <= MAX_TILE_NODES:  # one tile: no scratch (and no torch import to say so)
            return 0
        from bole_cli.kernels.tree_verify import verify_scratch_bytes  # torch and triton: here only

        batch = max(self.rows - 1, 1)
        return verify_scratch_bytes(batch * self.draft_tokens, batch, self.key_heads, self.value_heads,
                                    self.key_dim, self.value_dim, self.draft_tokens)

    def snapshot_node_bytes_per_layer(self) -> int:
        """What SGLang stores per draft token and layer: a full state and a conv window."""
        return (state_snapshot_bytes(self.value_heads, self.value_dim, self.key_dim,
                                     FLOAT_DTYPES[self.ssm_dtype])
                + conv_window_bytes(self.conv_dim, self.conv_window, FLOAT_DTYPES[self.conv_dtype]))

    def snapshot_bytes(self) -> int:
        """intermediate_ssm + intermediate_conv_window as SGLang would allocate them on CUDA:
        dense windows for trees, one deduplicated [conv_dim, D + W - 2] window per row for
        chains (memory_pool.py conv_window_dedup_enabled / _allocate_deduplicated_conv_window)."""
        if not self.chain:
            return self.layers * self.tokens * self.snapshot_node_bytes_per_layer()
        ssm = state_snapshot_bytes(self.value_heads, self.value_dim, self.key_dim,
                                   FLOAT_DTYPES[self.ssm_dtype])
        window = conv_window_bytes(self.conv_dim, self.draft_tokens + self.conv_window - 1,
                                   FLOAT_DTYPES[self.conv_dtype])
        return self.layers * (self.tokens * ssm + self.rows * window)

    def saved_bytes(self) -> int:
        return self.snapshot_bytes() - self.arena_bytes() - self.scratch_bytes()

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(mode=self.mode, tokens=self.tokens, arena_bytes=self.arena_bytes(), scratch_bytes=self.scratch_bytes(),
                 snapshot_bytes=self.snapshot_bytes(), saved_bytes=self.saved_bytes())
        return d


def _draft_steps(value: Any) -> Optional[int]:
    """--speculative-num-steps as a depth bound, or None when it is not a positive int."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else None


def decide(facts: Mapping[str, Any]) -> tuple[Optional[BolePlan], str]:
    """(plan, "") when Bole should own this pool's tree or chain verify; else (None, why not).

    Every key is optional; a missing fact counts as the conservative answer (topk absent or
    None is SGLang's chain). Keys: disabled, gdn, kda, draft_worker, algorithm, topk,
    chains (BOLE_CHAINS's raw value), draft_tokens, replayssm, replayssm_spec,
    unified_memory, page_major, disagg_mode, role_switch, npu, hip, pp_spec, torch_compile,
    conv_shapes [(dim, W-1), ...], temporal (HV, V, K), key_heads, layers, ssm_dtype,
    conv_dtype, act_dtype, max_batch, precision, num_steps.
    """
    f = dict(facts)
    topk = f.get("topk")
    chain = is_chain(topk)
    chains = chains_enabled(f.get("chains"))
    checks = (
        (f.get("disabled"), f"{ENV_DISABLE} is set"),
        (not f.get("gdn"), "the model has no Gated DeltaNet layers"),
        (f.get("kda"), "KDA (Kimi linear attention) models are not handled"),
        (f.get("draft_worker"), "draft-model pool"),
        (str(f.get("algorithm") or "").upper() not in TREE_ALGORITHMS,
         f"speculative algorithm {f.get('algorithm')!r} is not one of {', '.join(TREE_ALGORITHMS)}"),
        (not chain and (not isinstance(topk, int) or isinstance(topk, bool)),
         f"--speculative-eagle-topk {topk!r} is not an integer"),
        (not isinstance(f.get("draft_tokens"), int) or f["draft_tokens"] < 1,
         "no --speculative-num-draft-tokens"),
        (f.get("replayssm_spec"),
         "--enable-linear-replayssm-spec: SGLang's ReplaySSM verifies the chain without "
         "snapshots; Bole stays out of the way (SGLang's sizing and pool unchanged)"),
        (f.get("replayssm"), "--enable-linear-replayssm (SGLang's ReplaySSM decode ring)"),
        (chain and chains is False,
         f"--speculative-eagle-topk {topk!r} (a chain) with {ENV_CHAINS}={f.get('chains')!r}: "
         "chains keep SGLang's path"),
        (chain and chains is None,
         f"{ENV_CHAINS}={f.get('chains')!r} (use 1 or 0); chains keep SGLang's path"),
        (f.get("unified_memory"), "--enable-unified-memory uses its own pool"),
        (f.get("page_major"), "page-major (envelope) state layout"),
        (str(f.get("disagg_mode") or "null") != "null" or f.get("role_switch"),
         "PD disaggregation"),
        (f.get("npu") or f.get("hip"), "not an NVIDIA CUDA device"),
        (f.get("pp_spec"), "SGLANG_ENABLE_PP_SPEC (stable-row pipeline speculation)"),
        (f.get("torch_compile"),
         "--enable-torch-compile (the factor lookup by data_ptr() cannot be traced by dynamo)"),
        (len(f.get("conv_shapes") or ()) != 1, "not exactly one conv state per layer"),
        (canonical_dtype(f.get("ssm_dtype")) not in KERNEL_STATE_DTYPES,
         f"--mamba-ssm-dtype {f.get('ssm_dtype')!r} (Bole supports "
         f"{', '.join(KERNEL_STATE_DTYPES)})"),
        (canonical_dtype(f.get("conv_dtype")) not in FLOAT_DTYPES,
         f"conv state dtype {f.get('conv_dtype')!r}"),
        (canonical_dtype(f.get("act_dtype")) not in FLOAT_DTYPES,
         f"model dtype {f.get('act_dtype')!r}"),
        (verify_precision(f.get("precision")) not in (None,) + PLUGIN_VERIFY_PRECISIONS,
         f"{ENV_PRECISION}={f.get('precision')!r} (use one of {', '.join(PLUGIN_VERIFY_PRECISIONS)})"),
    )
    for bad, why in checks:
        if bad:
            return None, why
    try:
        hv, vdim, kdim = (int(x) for x in f["temporal"])
        (conv_dim, window), = [(int(a), int(b)) for a, b in f["conv_shapes"]]
        plan = BolePlan(
            layers=int(f["layers"]), key_heads=int(f["key_heads"]), key_dim=kdim,
            value_heads=hv, value_dim=vdim, conv_dim=conv_dim, conv_window=window,
            draft_tokens=int(f["draft_tokens"]), rows=max(int(f.get("max_batch") or 1), 1) + 1,
            act_dtype=canonical_dtype(f["act_dtype"]), conv_dtype=canonical_dtype(f["conv_dtype"]),
            ssm_dtype=canonical_dtype(f["ssm_dtype"]), precision=verify_precision(f.get("precision")),
            chain=chain, draft_steps=_draft_steps(f.get("num_steps")))
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"could not read the pool shapes ({type(exc).__name__}: {exc})"
    if plan.layers < 1 or plan.key_heads < 1 or hv % plan.key_heads:
        return None, f"unexpected GDN shapes (layers {plan.layers}, H {plan.key_heads}, HV {hv})"
    if conv_dim != 2 * plan.key_heads * kdim + hv * vdim:
        return None, (f"conv dim {conv_dim} is not 2*H*K + HV*V = "
                      f"{2 * plan.key_heads * kdim + hv * vdim} (not a GDN q|k|v conv)")
    if plan.draft_tokens > MAX_TREE_NODES:
        return None, (f"{plan.draft_tokens} draft tokens per request; Bole's kernels take at most "
                      f"{MAX_TREE_NODES}")
    return plan, ""



def plugin_disabled(value: Optional[str]) -> bool:
    """BOLE_DISABLE's value by the one flag rule (bole_cli/env.py): off unless set on; a value
    it cannot read keeps the plug-in out (the safe side)."""
    return env.flag(value, False) is not False
