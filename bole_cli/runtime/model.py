"""The complete Qwen3.5 hybrid forward (GDN + gated full attention + dense/MoE MLP) at a
catalogue ModelSpec's shapes, with random weights, in plain PyTorch plus the GDN kernels.

What it is for: timing a real decode step and a real tree verify (the calibrate sweep,
`bole bench e2e`) and proving, on a tiny model on CPU, that tree verification + commit is
exactly sequential decoding. Weights are random (cost matters, not what the model says).

    model = HybridModel(spec, "cuda", torch.bfloat16)
    cache = model.new_cache(slots=8, max_len=4096)
    logits = model.decode(cache, tokens, slots)                 # one token per request
    out = model.verify(cache, forest, tokens, slots)            # logits per tree node
    model.commit(cache, out, accepted)                          # accepted[b]: local node, -1 none

Layer layout (Qwen3.5 / Qwen3-Next): every layer is pre-norm mixer + residual, pre-norm
MLP + residual; the mixer is a GDN layer or, at `spec.attention_layer_ids`, gated full
attention. Simplifications that do not change cost: norms multiply by w (not 1 + w), the
rotary embedding is a plain partial RoPE over a quarter of each head, the GDN conv has no
bias (as in Qwen3.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from bole_cli import footprint
from bole_cli.catalog.models import ModelSpec, tiny_spec  # noqa: F401 - runtime's name for it
from bole_cli.errors import InputError
from bole_cli.footprint import gdn_proj_width, param_shapes  # noqa: F401 - the runtime's names too
from bole_cli.kernels.types import VerifyResult
from bole_cli.runtime import gdn_ops
from bole_cli.runtime.attention import (cache_attention, split_attention_works, split_tree_attention,
                                        varlen_attention_works, varlen_cache_attention)
from bole_cli.runtime.batch import DecodeBatch, Rope, TreeBatch, forest_arrays, prepare_decode, prepare_tree
from bole_cli.runtime.fusion import RMS_EPS, Fusion, NormedRows
from bole_cli.runtime.moe import grouped_mm_works, moe_forward
from bole_cli.runtime.snapshot import SnapshotGDN
from bole_cli.limits import MAX_TREE_NODES, SKINNY_DEFAULT_MAX_ROWS, SKINNY_MM_MAX_ROWS

# The projections the skinny GEMM can take (HybridModel.skinny_mm), by the name each call
# site passes; "fc" is the drafter's input projection.
SKINNY_PROJECTIONS = ("in_proj", "out_proj", "qkv", "o_proj", "gate_up", "down", "lm_head", "fc")
# The ones the runtime takes through it by default on CUDA with bf16 activations, at up to
# limits.SKINNY_DEFAULT_MAX_ROWS rows (why: there); in SKINNY_PROJECTIONS' order.
SKINNY_DEFAULT = ("in_proj", "out_proj", "o_proj", "down", "lm_head")


def skinny_defaults(device_type: str, dtype: torch.dtype) -> tuple[tuple[str, ...], int]:
    """(projections, max rows) a model takes through the skinny GEMM unless told otherwise."""
    if device_type == "cuda" and dtype == torch.bfloat16:
        return SKINNY_DEFAULT, SKINNY_DEFAULT_MAX_ROWS
    return (), SKINNY_MM_MAX_ROWS

ROPE_FRACTION = 0.25
GDN_DECODE = ("auto", "fused", "recurrent", "tree", "sglang")
PATHS = ("bole", "snapshot", "replayssm")  # replayssm: chains, bole_cli/runtime/replayssm.py


def param_bytes(s: ModelSpec, dtype: torch.dtype) -> int:
    """Exact bytes of HybridModel(s, dtype)'s weights (bole_cli.footprint's count)."""
    return footprint.param_bytes(s, torch.empty((), dtype=dtype).element_size(),
                                 torch.empty((), dtype=gdn_ops.factor_dtype(dtype)).element_size())


class _Weights:
    """A plain namespace of tensors (no autograd, no nn.Module machinery)."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)

    def tensors(self):
        return [t for t in self.__dict__.values() if isinstance(t, torch.Tensor)]


@dataclass
class Layer:
    kind: str  # "gdn" or "attn"
    index: int  # index among layers of its kind (cache row)
    norms: _Weights
    mixer: _Weights
    mlp: _Weights


@dataclass
class HybridCache:
    """Per-slot decoding state: GDN states, conv windows, KV cache, committed lengths."""

    gdn_state: torch.Tensor  # [L_gdn, S, HV, V, K] float32 (float64 in exact tests)
    conv_state: torch.Tensor  # [L_gdn, *conv_state_shape(S, D, W)]
    k_cache: torch.Tensor  # [L_attn, S, H_kv, max_len, head_dim]
    v_cache: torch.Tensor
    kv_lens: list[int]  # committed tokens per slot (host)

    @property
    def n_slots(self) -> int:
        return len(self.kv_lens)

    @property
    def max_len(self) -> int:
        return self.k_cache.shape[3]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gdn_state, self.conv_state, self.k_cache, self.v_cache))

    def clone(self) -> "HybridCache":
        return HybridCache(self.gdn_state.clone(), self.conv_state.clone(), self.k_cache.clone(),
                           self.v_cache.clone(), list(self.kv_lens))


@dataclass
class VerifyOutput:
    """A tree verify's results: logits per node and what the commit needs."""

    logits: torch.Tensor  # [N, vocab]
    batch: TreeBatch
    path: str  # "bole" or "snapshot"
    x: torch.Tensor  # [L_gdn, N, conv_dim] conv inputs (for the conv-window commit): a view of
    # the in_proj outputs, which the projection writes in place (no copy a layer)
    k: Optional[torch.Tensor] = None  # bole: [L_gdn, N, H, dk] raw keys
    v: Optional[torch.Tensor] = None  # bole: [L_gdn, N, HV, dv] (the replay commit's rows); k and v
    # are views of conv_out, which the conv writes in place (no copy a layer)
    conv_out: Optional[torch.Tensor] = None  # bole: [L_gdn, N, conv_dim] q | k | v, held for the commit
    a: Optional[torch.Tensor] = None  # bole: [L_gdn, N, HV] raw gate inputs, views of the in_proj
    b: Optional[torch.Tensor] = None  # outputs (the kernels compute g and beta from them)
    # bole: the verify's factors, one layer's scratch [N, HV, dv] / [N, HV]
    u: Optional[torch.Tensor] = None
    log_p: Optional[torch.Tensor] = None
    snapshots: Optional[torch.Tensor] = None  # snapshot: [L_gdn, B, T+1, HV, V, K]
    rings: Optional[dict] = None  # replayssm: the raw-input rings of every GDN layer


class HybridModel:
    """Random-weight Qwen3.5-style hybrid model.

    gdn_backend: "auto" | "kernels" | "reference" (GDNOps). gdn_decode: the GDN core of a
    plain decode step: "fused" (kernels.gdn_decode: conv, gates, recurrence and gated norm
    in one launch a layer, as production engines decode), "recurrent" (PyTorch one-token
    recurrence), "tree" (tree_verify + tree_commit_replay on one-node trees), "sglang"
    (SGLang's fused recurrent decode kernel, needs `snapshot` built with SGLang's kernels),
    "auto" (fused when the kernels are in use, else recurrent). snapshot: the SnapshotGDN engine of path="snapshot".
    grouped_mm: MoE experts through torch._grouped_mm (default: when it works for the
    device and dtype) or a loop over experts. split_attention: tree attention as a
    mask-free cache part plus a small tree part when the batch shares one committed
    length (runtime.attention; default: when the probe passes), else one dense mask.
    varlen_attention: otherwise (lengths that differ, a bucketed KV read) the cache part
    as flash varlen over each request's keys (default: when its probe passes, CUDA only).
    compile: the elementwise pieces between the matmuls compiled by torch.compile
    (runtime.fusion; default: on CUDA), else eager. cache_kernel: the attention to the
    committed keys through kernels.cache_attention (split along the keys, any lengths, no
    mask; default: on CUDA with 16-bit activations), else the SDPA / flash paths above.
    attention_in_kernel: an attention layer's q/k norm, RoPE and KV-cache write in one launch
    (kernels.attention_in; default: on CUDA with 16-bit activations, as cache_kernel), else
    the compiled pieces and two index writes. kv_compact_kernel: a verify commit's KV move in
    one launch (kernels.kv_compact; default: on CUDA), else tensor ops.
    skinny_mm: the projections that steps of few rows take through kernels.skinny_mm instead
    of cuBLAS, the norms, adds, SwiGLU and gates around them fused in: True for every one,
    False for none, or some of SKINNY_PROJECTIONS by name; skinny_max_rows: up to how many rows
    (default limits.SKINNY_MM_MAX_ROWS). Default (None): skinny_defaults (with every projection
    a 9B decode took 6.06 ms against 5.06 without, experiments/README.md R-13).
    """

    def __init__(self, spec: ModelSpec, device="cpu", dtype: torch.dtype = torch.bfloat16, *,
                 seed: int = 0, gdn_backend: str = "auto", gdn_decode: str = "auto",
                 snapshot: Optional[SnapshotGDN] = None, grouped_mm: Optional[bool] = None,
                 split_attention: Optional[bool] = None, varlen_attention: Optional[bool] = None,
                 compile: Optional[bool] = None, cache_kernel: Optional[bool] = None,
                 attention_in_kernel: Optional[bool] = None, kv_compact_kernel: Optional[bool] = None,
                 skinny_mm: Union[None, bool, str, Iterable[str]] = None,
                 skinny_max_rows: Optional[int] = None):
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.fdtype = gdn_ops.factor_dtype(dtype)
        self.ops = gdn_ops.GDNOps(gdn_backend, self.device)
        self.snapshot = snapshot if snapshot is not None else SnapshotGDN()
        self.replayssm = None  # path="replayssm": a runtime.replayssm.ReplaySSMGDN, set by its user
        if gdn_decode not in GDN_DECODE:
            raise InputError(f"gdn_decode {gdn_decode!r}: expected one of {', '.join(GDN_DECODE)}")
        if gdn_decode == "auto":
            gdn_decode = "fused" if self.ops.uses_kernel("gdn_decode") else "recurrent"
        if gdn_decode == "sglang" and self.snapshot.engine != "sglang":
            raise InputError("gdn_decode 'sglang' needs snapshot=SnapshotGDN(load_sglang_gdn())")
        self.gdn_decode = gdn_decode
        self.grouped_mm = grouped_mm_works(self.device.type, dtype) if grouped_mm is None else grouped_mm
        if spec.attn_heads % spec.attn_kv_heads or spec.gdn_value_heads % spec.gdn_key_heads:
            raise InputError(f"{spec.name}: query heads must be a multiple of KV heads (attention and GDN)")
        self.split_attention = (split_attention_works(self.device.type, dtype, spec.attn_head_dim)
                                if split_attention is None else split_attention)
        self.varlen_attention = (varlen_attention_works(self.device.type, dtype, spec.attn_head_dim)
                                 if varlen_attention is None else varlen_attention)
        self.rope = Rope(int(spec.attn_head_dim * ROPE_FRACTION) // 2 * 2)
        self.fuse = Fusion(self.device.type == "cuda" if compile is None else compile)
        gpu_16bit = self.device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
        self.cache_kernel = gpu_16bit if cache_kernel is None else cache_kernel
        self.attention_in_kernel = gpu_16bit if attention_in_kernel is None else attention_in_kernel
        self.kv_compact_kernel = self.device.type == "cuda" if kv_compact_kernel is None else kv_compact_kernel
        self.set_skinny(skinny_mm, skinny_max_rows)
        if self.device.type == "cuda":  # the fused decode's split counters (256 KiB), before any capture
            from bole_cli.kernels.skinny_mm import reserve_counters

            reserve_counters(self.device)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._build()

    # ---- weights ------------------------------------------------------------------------
    def _rand(self, shape, std: float, dtype=None) -> torch.Tensor:
        t = torch.randn(shape, generator=self._gen, device=self.device, dtype=dtype or self.dtype)
        return t.mul_(std)

    def _linear(self, shape, scale: float = 1.0) -> torch.Tensor:
        return self._rand(shape, scale * shape[-1] ** -0.5)

    def _build(self) -> None:
        s, shapes = self.spec, param_shapes(self.spec)
        out_scale = (2.0 * max(s.layers, 1)) ** -0.5
        m = shapes["model"]
        self.embed = self._rand(m["embed"], 1.0)
        self.final_norm = torch.ones(m["final_norm"], device=self.device, dtype=self.dtype)
        self.lm_head = self.embed if s.tied_embeddings else self._linear(m["lm_head"])
        attn_ids = set(s.attention_layer_ids)
        self.layers: list[Layer] = []
        n_gdn = n_attn = 0
        for i in range(s.layers):
            norms = _Weights(**{k: torch.ones(v, device=self.device, dtype=self.dtype)
                                for k, v in shapes["norms"].items()})
            if i in attn_ids:
                a = shapes["attn"]
                mixer = _Weights(qkv_proj=self._linear(a["qkv_proj"]),
                                 q_norm=torch.ones(a["q_norm"], device=self.device, dtype=self.dtype),
                                 k_norm=torch.ones(a["k_norm"], device=self.device, dtype=self.dtype),
                                 o_proj=self._linear(a["o_proj"], out_scale))
                layer = Layer("attn", n_attn, norms, mixer, None)
                n_attn += 1
            else:
                g = shapes["gdn"]
                hv = g["A_log@f"]
                # mild decay (g around -0.1) so the committed state matters in the tests
                a_log = torch.empty(hv, device=self.device, dtype=self.fdtype).uniform_(0.5, 2.0, generator=self._gen).log_()
                mixer = _Weights(in_proj=self._linear(g["in_proj"]),
                                 conv_w=self._rand(g["conv_w"], s.conv_kernel ** -0.5),
                                 conv_b=None, A_log=a_log,
                                 dt_bias=torch.full(hv, -2.0, device=self.device, dtype=self.fdtype),
                                 norm_w=torch.ones(g["norm_w"], device=self.device, dtype=self.dtype),
                                 out_proj=self._linear(g["out_proj"], out_scale))
                layer = Layer("gdn", n_gdn, norms, mixer, None)
                n_gdn += 1
            layer.mlp = self._build_mlp(shapes["mlp"], out_scale)
            self.layers.append(layer)
        self.n_gdn, self.n_attn = n_gdn, n_attn
        # every GDN layer's A_log and dt_bias as rows of one [L_gdn, HV] tensor (the layers
        # hold views): the gated replay commit reads all layers' gates in one launch
        gdn = [layer.mixer for layer in self.layers if layer.kind == "gdn"]
        self.gdn_A_log = self.gdn_dt_bias = None
        if gdn:
            self.gdn_A_log = torch.stack([w.A_log for w in gdn])
            self.gdn_dt_bias = torch.stack([w.dt_bias for w in gdn])
            for i, w in enumerate(gdn):
                w.A_log, w.dt_bias = self.gdn_A_log[i], self.gdn_dt_bias[i]

    def _build_mlp(self, m: dict, out_scale: float) -> _Weights:
        if not self.spec.is_moe:
            return _Weights(gate_up=self._linear(m["gate_up"]), down=self._linear(m["down"], out_scale))
        w = _Weights(router=self._linear(m["router"]), w13=self._linear(m["w13"]),
                     w2=self._linear(m["w2"], out_scale), shared_gate_up=None)
        if "shared_gate_up" in m:
            w.shared_gate_up = self._linear(m["shared_gate_up"])
            w.shared_down = self._linear(m["shared_down"], out_scale)
            w.shared_gate = self._linear(m["shared_gate"])
        return w

    def weight_tensors(self) -> list[torch.Tensor]:
        ts = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            ts += layer.norms.tensors() + layer.mixer.tensors() + layer.mlp.tensors()
        return ts

    @property
    def param_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weight_tensors())

    # ---- cache --------------------------------------------------------------------------
    def new_cache(self, slots: int, max_len: int, *, random_fill: bool = False, seed: int = 1) -> HybridCache:
        """Zeroed per-slot state (or random non-zero contents, for timing)."""
        s = self.spec
        kw = dict(device=self.device)
        cache = HybridCache(
            gdn_state=torch.zeros(self.n_gdn, slots, s.gdn_value_heads, s.gdn_value_dim, s.gdn_key_dim,
                                  dtype=self.fdtype, **kw),
            conv_state=torch.zeros((self.n_gdn,) + gdn_ops.conv_state_shape(slots, s.conv_dim, s.conv_kernel),
                                   dtype=self.dtype, **kw),
            k_cache=torch.zeros(self.n_attn, slots, s.attn_kv_heads, max_len, s.attn_head_dim, dtype=self.dtype, **kw),
            v_cache=torch.zeros(self.n_attn, slots, s.attn_kv_heads, max_len, s.attn_head_dim, dtype=self.dtype, **kw),
            kv_lens=[0] * slots,
        )
        if random_fill:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            for t, std in ((cache.gdn_state, 0.05), (cache.conv_state, 1.0), (cache.k_cache, 1.0), (cache.v_cache, 1.0)):
                t.normal_(0.0, std, generator=gen)
        return cache

    # ---- preparation (host) -------------------------------------------------------------
    def prepare_decode(self, cache: HybridCache, tokens, slots: Optional[Sequence[int]] = None,
                       *, kv_bucket: int = 1) -> DecodeBatch:
        slots = list(range(len(tokens))) if slots is None else [int(x) for x in slots]
        return prepare_decode(tokens, slots, cache.kv_lens, rope=self.rope, dtype=self.dtype,
                              device=self.device, n_slots=cache.n_slots, max_len=cache.max_len,
                              kv_bucket=kv_bucket, varlen=self.varlen_attention)

    def prepare_verify(self, cache: HybridCache, forest, tokens, slots: Optional[Sequence[int]] = None,
                       *, kv_bucket: int = 1) -> TreeBatch:
        parents, cu = forest_arrays(forest)
        if slots is None:
            slots = range(len(cu) - 1)
        largest = max((cu[b + 1] - cu[b] for b in range(len(cu) - 1)), default=0)
        if self.ops.uses_kernel("tree_verify") and largest > MAX_TREE_NODES:
            raise InputError(f"a request's tree has {largest} nodes; the tree kernels take at most "
                             f"{MAX_TREE_NODES} (the kernels' limit)")
        return prepare_tree((parents, cu), tokens, slots, cache.kv_lens, rope=self.rope, dtype=self.dtype,
                            device=self.device, n_slots=cache.n_slots, max_len=cache.max_len,
                            gqa_group=self.spec.attn_group, n_gdn_layers=self.n_gdn, kv_bucket=kv_bucket,
                            split=self.split_attention and kv_bucket == 1, varlen=self.varlen_attention,
                            bias_dtype=self.fdtype)

    # ---- public steps -------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, cache: HybridCache, tokens, slots: Optional[Sequence[int]] = None) -> torch.Tensor:
        """One token per request (slots default 0..B-1). Returns logits [B, vocab]; the
        cache advances by one token per request."""
        db = self.prepare_decode(cache, tokens, slots)
        logits = self.forward_decode(cache, db)
        for s in db.host_slots:
            cache.kv_lens[s] += 1
        return logits

    @torch.inference_mode()
    def verify(self, cache: HybridCache, forest, tokens, slots: Optional[Sequence[int]] = None,
               *, path: str = "bole") -> VerifyOutput:
        """Score every node of a packed forest (bole_cli.trees.Forest or (parents,
        cu_seqlens)); `tokens` [N] are the nodes' tokens. The GDN states, conv windows and
        committed KV are left untouched until `commit`."""
        return self.forward_verify(cache, self.prepare_verify(cache, forest, tokens, slots), path=path)

    @torch.inference_mode()
    def commit(self, cache: HybridCache, out: VerifyOutput, accepted) -> None:
        """Make each request's root-to-`accepted[b]` path (local index, -1 = none) the
        committed prefix: GDN states (all layers, one call), conv windows, KV cache, lengths."""
        tb = out.batch
        acc = [int(a) for a in (accepted.tolist() if hasattr(accepted, "tolist") else accepted)]
        if len(acc) != tb.batch:
            raise InputError(f"accepted has {len(acc)} entries for {tb.batch} requests")
        start = 0
        advance = []
        for b, (a, size) in enumerate(zip(acc, tb.host_sizes)):
            if not -1 <= a < size:
                raise InputError(f"accepted: request {b} accepts node {a}, outside -1..{size - 1}")
            advance.append(0 if a < 0 else tb.host_depths[start + a] + 1)
            start += size
        self.commit_device(cache, out, torch.tensor(acc, dtype=torch.int64, device=self.device))
        for s, n in zip(tb.host_slots, advance):
            cache.kv_lens[s] += n

    # ---- device-only forwards (no host sync when the GDN ops are kernels) ----------------
    def _run(self, tokens: torch.Tensor, gdn, attn, layers: Optional[Sequence[Layer]] = None) -> torch.Tensor:
        """Embedding, layers, final norm, LM head. Each residual add is fused with the norm
        after it (the next layer's input norm, or the final norm)."""
        layers = self.layers if layers is None else list(layers)
        x = F.embedding(tokens, self.embed)
        h = NormedRows(x, None, layers[0].norms.input_norm if layers else self.final_norm, self.fuse)
        for i, layer in enumerate(layers):
            mixed = gdn(layer, h) if layer.kind == "gdn" else attn(layer, h)
            h = NormedRows(h.total(), mixed, layer.norms.post_norm, self.fuse)
            after = layers[i + 1].norms.input_norm if i + 1 < len(layers) else self.final_norm
            out = self._mlp(layer.mlp, h)
            h = NormedRows(h.total(), out, after, self.fuse)
        return self.project(h, self.lm_head, "lm_head")

    @property
    def skinny_mm(self) -> tuple[str, ...]:
        """The projections that steps of few rows take through kernels.skinny_mm (() when
        none do)."""
        return tuple(k for k in SKINNY_PROJECTIONS if k in self._skinny_kinds)

    @skinny_mm.setter
    def skinny_mm(self, which: Union[None, bool, str, Iterable[str]]) -> None:
        self.set_skinny(which)

    @property
    def skinny_max_rows(self) -> int:
        """Up to how many rows a step's projections take the skinny GEMM."""
        return self._skinny_rows

    @skinny_max_rows.setter
    def skinny_max_rows(self, rows: int) -> None:
        if not 1 <= rows <= SKINNY_MM_MAX_ROWS:
            raise InputError(f"skinny_max_rows {rows}: expected 1..{SKINNY_MM_MAX_ROWS}")
        self._skinny_rows = rows

    def set_skinny(self, which: Union[None, bool, str, Iterable[str]] = None,
                   max_rows: Optional[int] = None) -> None:
        """Which projections take the skinny GEMM and up to how many rows: None for the
        device's default (skinny_defaults), else True, False or names, up to max_rows
        (default limits.SKINNY_MM_MAX_ROWS)."""
        if which is None:
            which, rows = skinny_defaults(self.device.type, self.dtype)
            max_rows = rows if max_rows is None else max_rows
        self.skinny_max_rows = SKINNY_MM_MAX_ROWS if max_rows is None else max_rows
        if isinstance(which, bool):
            kinds = frozenset(SKINNY_PROJECTIONS if which else ())
        else:
            kinds = frozenset(k.strip() for k in (which.split(",") if isinstance(which, str) else which))
            kinds -= {""}
            unknown = sorted(kinds - set(SKINNY_PROJECTIONS))
            if unknown:
                raise InputError(f"skinny_mm: unknown projection {unknown[0]!r}; "
                                 f"expected some of {', '.join(SKINNY_PROJECTIONS)}")
        self._skinny, self._skinny_kinds = None, kinds
        if kinds:
            from bole_cli.kernels.skinny_mm import reserve_counters, skinny_mm as kernel

            reserve_counters(self.device)  # before any step is captured
            self._skinny = kernel

    def project(self, x, w: torch.Tensor, kind: str, out: Optional[torch.Tensor] = None, *,
                glu: bool = False) -> torch.Tensor:
        """x @ w.T (into `out` when given), x rows or a layer's NormedRows; glu: w is gate|up
        and the result silu(gate) * up; kind: which of SKINNY_PROJECTIONS this is. The skinny
        GEMM kernel for a few rows when the model takes this kind through it (skinny_mm), the
        residual add, RMSNorm and SwiGLU fused into it; cuBLAS (or the CPU's GEMM) and the
        compiled pieces otherwise (the drafter projects through it too)."""
        normed = x if isinstance(x, NormedRows) else None
        rows = normed.x if normed is not None else x
        if self._skinny_takes(rows, kind):
            if normed is None:
                return self._skinny(x, w, out=out, glu=glu)
            if rows.dtype != torch.float16 and (normed.y is None or normed.y.stride(-1) == 1):  # fp16: unfused
                total = None if normed.y is None else torch.empty_like(normed.x)
                y = self._skinny(normed.x, w, out=out, residual=normed.y, norm=normed.w, eps=RMS_EPS,
                                 sum_out=total, glu=glu)
                if total is not None:
                    normed.sum = total
                return y
        if normed is not None:
            x = normed.rows()
        if not glu:
            return F.linear(x, w) if out is None else torch.mm(x, w.t(), out=out)
        y = self.fuse.swiglu(F.linear(x, w))
        return y if out is None else out.copy_(y)

    def _skinny_takes(self, rows: torch.Tensor, kind: str) -> bool:
        """Whether a projection `kind` of these rows goes through the skinny GEMM."""
        assert kind in SKINNY_PROJECTIONS, kind
        return (kind in self._skinny_kinds and 1 <= rows.shape[0] <= self.skinny_max_rows
                and rows.dtype != torch.float64 and rows.stride(-1) == 1)

    def _mlp(self, m: _Weights, x) -> torch.Tensor:
        if not self.spec.is_moe:
            return self.project(self.project(x, m.gate_up, "gate_up", glu=True), m.down, "down")
        x = x.rows() if isinstance(x, NormedRows) else x
        out = moe_forward(x, m.router, m.w13, m.w2, self.spec.experts_top_k, grouped=self.grouped_mm)
        if m.shared_gate_up is not None:
            shared = self.project(self.project(x, m.shared_gate_up, "gate_up", glu=True), m.shared_down, "down")
            out = out + torch.sigmoid(F.linear(x, m.shared_gate)) * shared
        return out

    def _gdn_in(self, w: _Weights, h: torch.Tensor, out: Optional[torch.Tensor] = None):
        """in_proj (q|k|v, z, b, a fused in one matmul) -> x [N, conv_dim], z, b, a (views);
        into `out` [N, width] when given (the verify keeps every layer's x, b and a for its commit)."""
        proj = self.project(h, w.in_proj, "in_proj", out=out)
        return self._gdn_in_split(proj)

    def _gdn_in_split(self, proj: torch.Tensor):
        """x, z, b, a: column views of in_proj outputs [..., width]."""
        s = self.spec
        cd, hv = s.conv_dim, s.gdn_value_heads
        zd = hv * s.gdn_value_dim
        return proj[..., :cd], proj[..., cd: cd + zd], proj[..., cd + zd: cd + zd + hv], proj[..., cd + zd + hv:]

    def _qkv(self, y: torch.Tensor):
        s = self.spec
        n, kd = y.shape[0], s.gdn_key_heads * s.gdn_key_dim
        q = y[:, :kd].view(n, s.gdn_key_heads, s.gdn_key_dim)
        k = y[:, kd: 2 * kd].view(n, s.gdn_key_heads, s.gdn_key_dim)
        v = y[:, 2 * kd:].view(n, s.gdn_value_heads, s.gdn_value_dim)
        return q, k, v

    def _gdn_out(self, w: _Weights, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm per head (rms(o) * w * silu(z)), then out_proj: one skinny GEMM whose
        operand is the normed heads when it takes the rows, else the compiled norm first."""
        n, hv, dv = o.shape
        rows = o.reshape(n, hv * dv)
        if self._skinny_takes(rows, "out_proj") and self.fdtype == torch.float32 and not dv & (dv - 1):
            return self._skinny(rows, w.out_proj, head_norm=w.norm_w, z=z.reshape(n, hv, dv), eps=RMS_EPS)
        return self.project(self.fuse.gated_norm(o, z, w.norm_w, self.fdtype), w.out_proj, "out_proj")

    def project_gated(self, o: torch.Tensor, gate: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """An attention output (any shape of N x heads x head_dim) times sigmoid(gate) [N,
        heads, head_dim], then o_proj `w`: the gate applied as the skinny GEMM loads its
        operand when it takes the rows, else compiled first (the drafter's too)."""
        rows = o.reshape(gate.shape[0], -1)
        if self._skinny_takes(rows, "o_proj"):
            return self._skinny(rows, w, gate=gate)
        return self.project(self.fuse.gated_out(o, gate), w, "o_proj")

    def _attn_in(self, w: _Weights, h, cos, sin, cache: HybridCache, l: int, slots, positions, k_out: bool):
        """q_proj (query | gate per head), k_proj, v_proj fused; q/k RMSNorm, RoPE; k and v
        written into the layer's cache at (slots, positions). -> q, gate, k (with k_out, else
        None), v [N, heads, head_dim]."""
        s = self.spec
        proj = self.project(h, w.qkv_proj, "qkv")
        kc, vc = cache.k_cache[l], cache.v_cache[l]
        if self.attention_in_kernel:
            from bole_cli.kernels.attention_in import attention_in

            return attention_in(proj, w.q_norm, w.k_norm, cos, sin, kc, vc, slots, positions, heads=s.attn_heads,
                                kv_heads=s.attn_kv_heads, eps=RMS_EPS, k_out=k_out)
        q, gate, k, v = self.fuse.attn_in(proj, w.q_norm, w.k_norm, cos, sin, s.attn_heads, s.attn_kv_heads,
                                          s.attn_head_dim)
        kc[slots, :, positions] = k
        vc[slots, :, positions] = v
        return q, gate, (k if k_out else None), v

    @staticmethod
    def _kv(cache: HybridCache, l: int, slots: torch.Tensor, slot_start: Optional[int], limit: int):
        """Keys/values [B, H_kv, limit, head_dim] of the batch's slots: a view when the slots
        are a contiguous range (the serving layout), else a gather."""
        kc, vc = cache.k_cache[l], cache.v_cache[l]
        if slot_start is not None:
            end = slot_start + slots.shape[0]
            return kc[slot_start:end, :, :limit], vc[slot_start:end, :, :limit]
        return kc[:, :, :limit].index_select(0, slots), vc[:, :, :limit].index_select(0, slots)

    def forward_decode(self, cache: HybridCache, db: DecodeBatch,
                       layers: Optional[Sequence[Layer]] = None) -> torch.Tensor:
        """One decode step on prepared metadata; updates GDN states, conv windows and writes
        the new KV at each request's committed length (lengths are the caller's)."""
        s = self.spec
        bsz = db.batch

        def gdn(layer: Layer, h):
            w, l = layer.mixer, layer.index
            x, z, b, a = self._gdn_in(w, h)
            if self.gdn_decode == "fused":
                o = self.ops.decode(x, cache.conv_state[l], w.conv_w, w.conv_b, a, b, w.A_log, w.dt_bias,
                                    cache.gdn_state[l], db.slots, key_heads=s.gdn_key_heads, z=z,
                                    norm_w=w.norm_w, eps=RMS_EPS)
                return self.project(o, w.out_proj, "out_proj")
            y = gdn_ops.conv_decode(x, cache.conv_state[l], w.conv_w, w.conv_b, db.slots)
            q, k, v = self._qkv(y)
            state = cache.gdn_state[l]
            if self.gdn_decode == "sglang":
                o = self.snapshot.decode_layer(q, k, v, a, b, w.A_log, w.dt_bias, state, db.slots, db.cu_seqlens)
            else:
                g, beta = self.ops.gates(w.A_log, a, w.dt_bias, b)
                if self.gdn_decode == "recurrent":
                    o = gdn_ops.recurrent_step(q, k, v, g, beta, state, db.slots)
                else:
                    res = self.ops.verify(q, k, v, g, beta, state, db.slots, db.parents, db.cu_seqlens,
                                          max_nodes=1)
                    self.ops.commit_replay(state, db.slots, k, v, g, beta, db.parents, db.cu_seqlens, db.accepted,
                                           max_nodes=1)
                    o = res.o
            return self._gdn_out(w, o, z)

        def attn(layer: Layer, h):
            w, l = layer.mixer, layer.index
            q, gate, _, _ = self._attn_in(w, h, db.cos, db.sin, cache, l, db.slots, db.positions, False)
            qf = q.view(bsz, s.attn_kv_heads, s.attn_group, s.attn_head_dim)
            if self.cache_kernel:
                o = cache_attention(qf, cache.k_cache[l], cache.v_cache[l], db.slots, used, db.kv_limit)[0]
            elif db.kv_used is not None:
                o = varlen_cache_attention(qf, cache.k_cache[l], cache.v_cache[l], db.slots, db.kv_used,
                                           group=self.spec.attn_group)[0]
            else:
                keys, vals = self._kv(cache, l, db.slots, db.slot_start, db.kv_limit)
                o = F.scaled_dot_product_attention(qf, keys, vals, attn_mask=db.attn_bias)
            return self.project_gated(o, gate, w.o_proj)

        used = db.positions + 1 if self.cache_kernel else None  # keys each request reads, the new one too
        return self._run(db.tokens, gdn, attn, layers)

    def forward_verify(self, cache: HybridCache, tb: TreeBatch, *, path: str = "bole",
                       layers: Optional[Sequence[Layer]] = None) -> VerifyOutput:
        """The tree forward on prepared metadata. Writes only scratch KV (past each
        request's committed length); everything the commit needs is in the output."""
        if path not in PATHS:
            raise InputError(f"path {path!r}: expected one of {', '.join(PATHS)}")
        s = self.spec
        n, bsz, t_max, grp = tb.n_nodes, tb.batch, tb.max_nodes, self.spec.attn_group
        kw = dict(device=self.device)
        proj = torch.empty(self.n_gdn, n, gdn_proj_width(s), dtype=self.dtype, **kw)  # in_proj outputs
        out = VerifyOutput(None, tb, path, proj[..., :s.conv_dim])
        if path == "bole":
            out.conv_out = torch.empty(self.n_gdn, n, s.conv_dim, dtype=self.dtype, **kw)
            _, k_all, v_all = self._qkv(out.conv_out.view(-1, s.conv_dim))
            out.k, out.v = k_all.unflatten(0, (self.n_gdn, n)), v_all.unflatten(0, (self.n_gdn, n))
            _, _, out.b, out.a = self._gdn_in_split(proj)
            out.u = torch.empty(n, s.gdn_value_heads, s.gdn_value_dim, dtype=self.fdtype, **kw)
            out.log_p = torch.empty(n, s.gdn_value_heads, dtype=self.fdtype, **kw)
        elif path == "replayssm":
            out.rings = self.replayssm.rings(cache.gdn_state, tb, s.gdn_key_heads, self.dtype)
        else:
            shape = SnapshotGDN.buffer_shape(self.n_gdn, bsz, t_max, cache.gdn_state)
            out.snapshots = torch.empty(shape, dtype=cache.gdn_state.dtype, **kw)

        def gdn(layer: Layer, h):
            w, l = layer.mixer, layer.index
            x, z, b, a = self._gdn_in(w, h, out=proj[l])
            y = self.ops.conv(x, cache.conv_state[l], w.conv_w, w.conv_b, tb.slots, tb.parents, tb.cu_seqlens,
                              out=out.conv_out[l] if path == "bole" else None)
            q, k, v = self._qkv(y)
            state = cache.gdn_state[l]
            if path == "bole":
                res = VerifyResult(torch.empty(v.shape, dtype=v.dtype, **kw), out.u, out.log_p)
                o = self.ops.verify_gated(q, k, v, a, b, w.A_log, w.dt_bias, state, tb.slots, tb.parents,
                                          tb.cu_seqlens, out=res, max_nodes=tb.max_nodes,
                                          max_depth=tb.max_depth - 1).o
            elif path == "replayssm":
                o = self.replayssm.verify_layer(out.rings, l, q, k, v, a, b, w.A_log, w.dt_bias, state, tb)
            else:
                g, beta = self.ops.gates(w.A_log, a, w.dt_bias, b)
                o = self.snapshot.verify_layer(out.snapshots[l], q, k, v, g, beta, a, b, w.A_log,
                                               w.dt_bias, state, tb)
            return self._gdn_out(w, o, z)

        def attn(layer: Layer, h):
            w, l = layer.mixer, layer.index
            one_kernel = self.cache_kernel and tb.tree_bias is not None  # the tree's keys read from the cache
            q, gate, k, v = self._attn_in(w, h, tb.cos, tb.sin, cache, l, tb.node_slot, tb.kv_pos, not one_kernel)
            q5 = tb.padded(q).view(bsz, t_max, s.attn_kv_heads, grp, s.attn_head_dim).transpose(1, 2)
            if one_kernel:  # keys base + local index: the scratch attention_in just wrote; q, o token-major
                o = cache_attention(q5, cache.k_cache[l], cache.v_cache[l], tb.slots, tb.base, tb.kv_limit,
                                    tree_bias=tb.tree_bias, tree_cu=tb.cu_seqlens)[0]
                o = tb.packed(o.transpose(1, 2).reshape(bsz * t_max, -1))  # a view (contiguous)
                return self.project_gated(o, gate, w.o_proj)
            qf = q5.reshape(bsz, s.attn_kv_heads, t_max * grp, s.attn_head_dim)
            if tb.kv_used is not None:
                part = varlen_cache_attention(qf, cache.k_cache[l], cache.v_cache[l], tb.slots, tb.kv_used)
                o = split_tree_attention(qf, None, None, tb.padded(k).transpose(1, 2),
                                         tb.padded(v).transpose(1, 2), tb.tree_bias, cache_part=part)
            elif tb.split_base is None:
                keys, vals = self._kv(cache, l, tb.slots, tb.slot_start, tb.kv_limit)
                o = F.scaled_dot_product_attention(qf, keys, vals, attn_mask=tb.attn_bias)
            else:
                keys, vals = self._kv(cache, l, tb.slots, tb.slot_start, tb.split_base)
                o = split_tree_attention(qf, keys, vals, tb.padded(k).transpose(1, 2),
                                         tb.padded(v).transpose(1, 2), tb.tree_bias)
            o = o.view(bsz, s.attn_kv_heads, t_max, grp, s.attn_head_dim).transpose(1, 2)
            o = tb.packed(o.reshape(bsz * t_max, -1))
            return self.project_gated(o, gate, w.o_proj)

        out.logits = self._run(tb.tokens, gdn, attn, layers)
        return out

    def commit_device(self, cache: HybridCache, out: VerifyOutput, accepted: torch.Tensor) -> None:
        """The commit's device work (no host sync with kernels; lengths are the caller's).
        accepted [B] int64 on the device."""
        tb = out.batch
        if tb.n_nodes == 0:
            return
        if self.n_gdn:
            if out.path == "bole":
                self.ops.commit_replay_gated(cache.gdn_state, tb.slots, out.k, out.v, out.a, out.b,
                                             self.gdn_A_log, self.gdn_dt_bias, tb.parents, tb.cu_seqlens,
                                             accepted, max_nodes=tb.max_nodes, max_depth=tb.max_depth - 1)
            elif out.path == "replayssm":
                self.replayssm.commit(cache.gdn_state, out.rings, tb, accepted)
            else:
                self.snapshot.commit(cache.gdn_state, out.snapshots, tb, accepted)
            conv = cache.conv_state
            self.ops.conv_commit(conv.view((-1,) + tuple(conv.shape[2:])), out.x.view(-1, out.x.shape[-1]),
                                 tb.layer_slots, tb.layer_parents, tb.layer_cu_seqlens,
                                 accepted.repeat(self.n_gdn))
        if self.n_attn and self.kv_compact_kernel:  # one launch (the tensor ops: ~20)
            from bole_cli.kernels.kv_compact import kv_compact

            kv_compact(cache.k_cache, cache.v_cache, tb.slots, tb.base, accepted, tb.cu_seqlens, tb.path_table)
        elif self.n_attn:
            self._compact_kv(cache, tb, accepted)

    @staticmethod
    def _compact_kv(cache: HybridCache, tb: TreeBatch, accepted: torch.Tensor) -> None:
        """Move the accepted path's scratch K/V (at base + local index) to base + depth (the
        CPU path; kernels.kv_compact on CUDA, tested equal).

        Entries past the path repeat the root's move (same value, so duplicates are
        harmless); a request that accepts nothing self-copies its first free position."""
        last = cache.max_len - 1
        ok = accepted >= 0
        first = tb.cu_seqlens[:-1].to(torch.int64) + accepted.clamp(min=0)
        rows = tb.path_table.index_select(0, first.clamp(max=tb.n_nodes - 1))  # [B, D] local ids
        base = tb.base[:, None]
        valid = (rows >= 0) & ok[:, None]
        depth = torch.arange(rows.shape[1], device=rows.device)[None, :]
        root_move = torch.where(ok[:, None], base + rows[:, :1].clamp(min=0), base)
        src = torch.where(valid, base + rows, root_move).clamp(max=last)
        dst = torch.where(valid, base + depth, base).clamp(max=last)
        slots = tb.slots[:, None].expand_as(src)
        for c in (cache.k_cache, cache.v_cache):
            c[:, slots, :, dst] = c[:, slots, :, src]
