"""The byte model: dtype names and sizes, per-node snapshots against Bole's factors.

The one place this arithmetic lives: `bole inspect-tree`, `bole models`, `bole serve`,
the catalogue (ModelSpec's byte figures) and the plug-in's arena plan
(bole_cli/sglang/plan.py, which imports this module inside SGLang's process: it stays
standard-library only) all call it (docs/design.md §2, §6). Every figure is derived from
shapes, dtypes and the tree size; nothing is tabulated per model.

Per draft node and GDN layer (paper Table I):
- snapshot: the full state, HV * dk * dv elements in the state dtype;
- factors: k shared across the GQA group (H * dk), u (HV * dv) and log_p (HV), all
  float32, so ``(H*dk + HV*dv + HV) * 4`` bytes whatever the state dtype.

SGLang preallocates the snapshots as MambaPool's ``intermediate_ssm`` buffer,
``[gdn_layers, slots + 1, draft_tokens, HV, V, K]`` in the state dtype, where slots is
the number of running requests it admits (its spec_state_size; the +1 is its padding
slot). Bole does not allocate it; that memory goes to the KV cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from bole_cli.errors import InputError

__all__ = [
    "FLOAT_DTYPES",
    "KV_DTYPES",
    "FACTOR_ELEM_BYTES",
    "canonical_dtype",
    "dtype_bytes",
    "state_snapshot_bytes",
    "factor_bytes",
    "conv_window_bytes",
    "snapshot_bytes_per_node_layer",
    "factor_bytes_per_node_layer",
    "factor_ratio",
    "sglang_snapshot_buffer_shape",
    "sglang_snapshot_buffer_bytes",
    "TransientMemory",
    "transient_memory",
    "format_bytes",
]

#: Byte units, in one home.
MiB = 1 << 20
GiB = 1 << 30

#: The floating dtypes of SGLang's recurrent state (--mamba-ssm-dtype: its parser's choices,
#: exactly these), conv windows and activations, with their element size.
FLOAT_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: KV-cache dtypes (SGLang --kv-cache-dtype; "auto" means the activation dtype, bf16).
KV_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "float": "float32"}
# --kv-cache-dtype's own names; the checked lookups below accept them for any kind.
_KV_ALIASES = {"auto": "bfloat16", "fp8": "fp8_e4m3"}
#: Factors (u, log_p; k in the paper's count) are kept in float32 regardless of the state dtype.
FACTOR_ELEM_BYTES = 4


def canonical_dtype(name: Any) -> str:
    """'torch.bfloat16' / 'bf16' / torch.bfloat16 -> 'bfloat16'. An unknown name comes
    back lower-cased, for the caller to accept or refuse."""
    key = str(name).strip().lower().removeprefix("torch.")
    return _ALIASES.get(key, key)


def _checked_dtype(name: str, table: dict[str, int], field: str) -> str:
    key = canonical_dtype(name)
    key = _KV_ALIASES.get(key, key)
    if key not in table:
        raise InputError(f"{field} {name!r}: expected one of {', '.join(table)}")
    return key


def dtype_bytes(name: str, *, kind: str = "state") -> int:
    """Element size of a state dtype (kind="state") or a KV-cache dtype (kind="kv")."""
    table, field = (FLOAT_DTYPES, "state dtype") if kind == "state" else (KV_DTYPES, "KV dtype")
    return table[_checked_dtype(name, table, field)]


def state_snapshot_bytes(value_heads: int, value_dim: int, key_dim: int, elem_bytes: int) -> int:
    """One full GDN recurrent state, HV x V x K elements: one request's state in one
    layer, and what a snapshotting verifier stores per draft node and layer."""
    return value_heads * value_dim * key_dim * elem_bytes


def factor_bytes(key_heads: int, key_dim: int, value_heads: int, value_dim: int, *,
                 k_bytes: int = FACTOR_ELEM_BYTES, v_bytes: int = FACTOR_ELEM_BYTES, scalars: int = 1) -> int:
    """Bole's per-node rows in one layer: k [H, K] (one per key head, shared by its GQA group
    of value heads) in `k_bytes`, one [HV, V] row in `v_bytes` and `scalars` float32 per
    value head. The paper's count (the defaults): u and log_p in float32. The replay commit
    keeps v in the activation dtype and g, beta (scalars=2)."""
    return (key_heads * key_dim * k_bytes + value_heads * value_dim * v_bytes
            + value_heads * scalars * FACTOR_ELEM_BYTES)


def conv_window_bytes(conv_dim: int, window: int, elem_bytes: int) -> int:
    """One conv window: the last `window` (kernel - 1) inputs of every conv channel."""
    return conv_dim * window * elem_bytes


def snapshot_bytes_per_node_layer(spec: Any, state_dtype: str = "float32") -> int:
    """One full GDN state (HV x dv x dk) in the state dtype: what SGLang stores per node."""
    return state_snapshot_bytes(spec.gdn_value_heads, spec.gdn_value_dim, spec.gdn_key_dim,
                                dtype_bytes(state_dtype))


def factor_bytes_per_node_layer(spec: Any) -> int:
    """Bole's per-node factors in one layer, all float32 (the paper's count)."""
    return factor_bytes(spec.gdn_key_heads, spec.gdn_key_dim, spec.gdn_value_heads,
                        spec.gdn_value_dim)


def factor_ratio(spec: Any, state_dtype: str = "float32") -> float:
    """How many times less per-node memory the factors take than a snapshot."""
    return snapshot_bytes_per_node_layer(spec, state_dtype) / factor_bytes_per_node_layer(spec)


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return value


def sglang_snapshot_buffer_shape(spec: Any, slots: int, draft_tokens: int) -> tuple[int, ...]:
    """MambaPool's intermediate_ssm shape: [gdn_layers, slots + 1, draft_tokens, HV, V, K]."""
    _positive("slots", slots)
    _positive("draft_tokens", draft_tokens)
    return (spec.n_gdn_layers, slots + 1, draft_tokens, spec.gdn_value_heads,
            spec.gdn_value_dim, spec.gdn_key_dim)


def sglang_snapshot_buffer_bytes(spec: Any, slots: int, draft_tokens: int,
                                 state_dtype: str = "float32") -> int:
    """Bytes SGLang preallocates for per-node snapshots (see the module docstring)."""
    n = 1
    for d in sglang_snapshot_buffer_shape(spec, slots, draft_tokens):
        n *= d
    return n * dtype_bytes(state_dtype)


@dataclass(frozen=True)
class TransientMemory:
    """Verify-time memory for `batch` requests of `nodes` draft nodes each.

    ``*_per_layer`` covers one GDN layer and the whole batch; ``snapshot_bytes`` and
    ``factor_bytes`` cover every GDN layer. ``kv_tokens_bought`` is how many more KV-cache
    tokens the snapshot-minus-factor difference holds; ``kv_tokens_freed`` is the same
    for SGLang's preallocated snapshot buffer, which Bole does not allocate.
    """

    model: str
    batch: int
    nodes: int
    slots: int
    state_dtype: str
    kv_dtype: str
    gdn_layers: int
    snapshot_bytes_per_node_layer: int
    factor_bytes_per_node_layer: int
    snapshot_bytes_per_layer: int
    factor_bytes_per_layer: int
    snapshot_bytes: int
    factor_bytes: int
    ratio: float
    saved_bytes: int
    kv_bytes_per_token: int
    kv_tokens_bought: int
    sglang_buffer_shape: tuple[int, ...]
    sglang_buffer_bytes: int
    kv_tokens_freed: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sglang_buffer_shape"] = list(self.sglang_buffer_shape)
        return d


def transient_memory(spec: Any, batch: int, nodes: int, state_dtype: str = "float32", *,
                     kv_dtype: str = "bfloat16", slots: Optional[int] = None) -> TransientMemory:
    """Snapshots vs factors for `batch` requests verifying `nodes` nodes each.

    `slots` is SGLang's running-request capacity for its snapshot buffer; it defaults to
    `batch` (the buffer for exactly this batch).
    """
    _positive("batch", batch)
    _positive("nodes", nodes)
    slots = batch if slots is None else _positive("slots", slots)
    state_dtype = _checked_dtype(state_dtype, FLOAT_DTYPES, "state dtype")
    kv_dtype = _checked_dtype(kv_dtype, KV_DTYPES, "KV dtype")
    snap_node = snapshot_bytes_per_node_layer(spec, state_dtype)
    fact_node = factor_bytes_per_node_layer(spec)
    layers = spec.n_gdn_layers
    total_nodes = batch * nodes
    snap_layer, fact_layer = total_nodes * snap_node, total_nodes * fact_node
    snap, fact = layers * snap_layer, layers * fact_layer
    kv_tok = spec.kv_bytes_per_token(KV_DTYPES[kv_dtype])
    buffer = sglang_snapshot_buffer_bytes(spec, slots, nodes, state_dtype)
    return TransientMemory(
        model=spec.name,
        batch=batch,
        nodes=nodes,
        slots=slots,
        state_dtype=state_dtype,
        kv_dtype=kv_dtype,
        gdn_layers=layers,
        snapshot_bytes_per_node_layer=snap_node,
        factor_bytes_per_node_layer=fact_node,
        snapshot_bytes_per_layer=snap_layer,
        factor_bytes_per_layer=fact_layer,
        snapshot_bytes=snap,
        factor_bytes=fact,
        ratio=snap_node / fact_node,
        saved_bytes=snap - fact,
        kv_bytes_per_token=kv_tok,
        kv_tokens_bought=(snap - fact) // kv_tok if kv_tok else 0,
        sglang_buffer_shape=sglang_snapshot_buffer_shape(spec, slots, nodes),
        sglang_buffer_bytes=buffer,
        kv_tokens_freed=max(buffer - fact, 0) // kv_tok if kv_tok else 0,
    )


def format_bytes(n: float) -> str:
    """Binary units, about three significant figures: 24712 -> '24.1 KiB'."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            break
        x /= 1024
    if unit == "B":
        return f"{int(n)} B"
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:.{digits}f} {unit}"
