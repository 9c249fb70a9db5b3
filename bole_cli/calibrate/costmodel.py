"""Roofline cost model of the hybrid forward: T_dec(c) and T_ver(N|c) without a GPU.

One forward over T tokens (T = batch for decode, T = N tree tokens across the batch for a
verify) is a sum over components, each a roofline of its own:

    t(component) = max(bytes / (bandwidth * eff.bw), flops / (bf16_peak * eff.flops))
    T_forward    = sum of t(component) + eff.launch_s * (layers + 2)
    (with t(component) >= kernels * eff.kernel_floor_s)

Components (bf16 weights and activations, fp32 recurrent state and logits):
- matmuls: every projection of every layer and the LM head reads its weights once per
  forward (MoE: only the experts touched, E * (1 - (1 - k/E)^T) distinct experts for T
  tokens with top-k routing, plus the shared expert and router) and its input/output
  activations; FLOPs 2 * params * tokens. Each matmul is its own roofline, so the knee
  appears where T * 2 * params / peak passes weight bytes / bandwidth, i.e. at
  T ~ (peak * eff.flops) / (bandwidth * eff.bw) tokens.
- attention (full-attention layers): the batch's KV cache read once (batch * kv_len * KV
  bytes per token and layer), the new K/V written, q/o traffic; FLOPs 4 * T * heads *
  head_dim * (kv_len + tokens per request) (QK^T and PV, tree mask block included); where
  the attention was measured as a component (eff.attention_cells), over its share of that
  roofline's speed by keys read and query rows a (request, KV head): tokens a request times
  the GQA group, what the kernel tiles, so one model's cells price another's group.
- GDN core: decode reads and writes the fp32 state (HV * dk * dv per request and layer);
  a Bole tree verify reads it once (closed form) and the commit reads and writes it once
  more, plus the per-node rows (k, u, log_p; the replay commit's k, v, g, beta) written and
  read; FLOPs per request and value head: 4 n dk dv (D_P Q S, K S), 4 n^2 dk (QK^T, KK^T
  Gram terms), 2 n^2 dv (d + 1) (Neumann series of depth d = min(n - 1, 8), and C U), and
  the replay commit (docs/design.md §2, §9) 6 dk dv a path node (decay, k . S, update).
  The depthwise conv and gates are counted as activation traffic. A verify's GDN core runs
  at a share of its roofline's speed: on the H200 measured per batch and nodes a request
  (eff.gdn_tree_cells; the tree kernels are latency-bound at serving sizes, 21-78% of it),
  1 elsewhere.
- norms and residuals: about 8 passes over T * hidden bf16 activations per layer.
- activation traffic (matmul inputs/outputs, q/k/v/o, norms, logits) stays in L2 while one
  kernel's share fits in half of it (eff.l2_bytes) and costs device-memory bandwidth only
  beyond that; weights, KV cache, recurrent state and factors always come from memory.
- logits: the LM head's bf16 logits (T * vocab) read and cast to fp32 for sampling.
- no kernel is shorter than eff.kernel_floor_s (small kernels are latency-bound), and a
  fixed launch overhead eff.launch_s per layer (and two for embedding, LM head/sampling);
  where the runtime's launches were measured (eff.runtime, the H200), instead: the launches
  a step makes beyond the priced kernels at the floor, a replay gap for every launch, and
  the host's share of a serving step.
The MTP/draft head is not part of the target forward: `time_draft_level` prices one level
of it (the same rooflines), `time_sample` the argmax and the host sync of a step.

Efficiency factors (eff.bw, eff.flops) are the fractions of the datasheet figures that
real kernels reach; see EFFICIENCY for the values and their reasons.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from bole_cli.catalog.hardware import GpuSpec
from bole_cli.catalog.models import ModelSpec
from bole_cli.footprint import does_not_fit, drafter_memory, step_memory
from bole_cli.limits import SKINNY_DEFAULT_MAX_ROWS

BF16 = 2
FP32 = 4
MAX_TREE_DEPTH = 8  # the Neumann series length assumed for the GDN verify FLOPs


@dataclass(frozen=True)
class RuntimeLaunches:
    """What one step of Bole's runtime launches beyond the rooflines above, where it was
    measured (bole_cli.calibrate.components derives these from the committed step records):
    kernels per layer of a one-row decode, of a decode of more rows (the one-row step fuses
    the add + RMSNorm into its skinny projections, limits.SKINNY_DEFAULT_MAX_ROWS) and of a
    verify step (the verify's metadata refill, tree conv, gates, copies, the cache/tree
    attention parts and the commit included), the gap
    between replayed launches, and the host's share of a serving step (inputs copied, graph
    launched, the sync)."""

    decode_launches_per_layer: float
    verify_launches_per_layer: float
    gap_s: float
    decode_host_s: float
    verify_host_s: float
    rows_decode_launches_per_layer: float  # a decode step of more than one row


@dataclass(frozen=True)
class Efficiency:
    bw: float  # fraction of datasheet bandwidth that weight/KV streaming kernels reach
    flops: float  # fraction of the datasheet bf16 peak that the forward's GEMMs reach
    launch_s: float  # fixed cost per layer (gaps between kernels under CUDA graphs)
    kernel_floor_s: float  # no kernel is shorter than this (small kernels are latency-bound)
    l2_bytes: float  # last-level cache; activations below half of it never reach DRAM
    why: str
    host_step_s: float = 1e-4  # per step: the sampled tokens' trip to the host (the sync)
    draft_kernels: int = 24  # kernels of one drafter level (each at least kernel_floor_s)
    runtime: Optional[RuntimeLaunches] = None  # measured launches replace launch_s (H200)
    # the GDN tree verify + commit's share of its roofline's speed: (batch, nodes a request,
    # share) where it was measured, interpolated in log of both between and beyond the cells
    # (clamped); () = 1 everywhere (an engine whose tree kernels run at their rooflines)
    gdn_tree_cells: tuple[tuple[float, float, float], ...] = ()
    # the fused one-token GDN decode's share of its roofline's speed (conv window, state read
    # and written): (batch, share) where measured, interpolated in log batch, clamped; () = 1
    gdn_decode_cells: tuple[tuple[float, float], ...] = ()
    # a full-attention layer's attention over the KV cache: (keys read = batch x cache length,
    # query rows a (request, KV head) = tokens x GQA group, share of its roofline's speed)
    # where measured, a full grid,
    # interpolated in log of both, clamped; () = 1 everywhere
    attention_cells: tuple[tuple[float, float, float], ...] = ()
    # the drafter level's attention (its rows stacked with the query group, no tree mask),
    # cells as attention_cells; () = the target's cells
    draft_attention_cells: tuple[tuple[float, float, float], ...] = ()
    # (x, y): a GEMM's time over its roofline's against x = its compute time over its
    # weight-streaming time (the roofline's knee is x = 1, where real GEMMs are slower than
    # either bound); interpolated in log x, clamped; () = the bare roofline
    gemm_knee: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Per-GPU efficiency factors, from figures independent of the results they predict (none is
# fitted to the Bole paper's budgets or speedups, nor to a measured profile;
# tests/test_calibrate.py checks the paper's knees as a tolerance and the H200 estimate
# against the shipped measured profiles). The H200's come from component microbenchmarks
# (bole_cli.calibrate.components re-derives them from the committed records, and a test
# holds the numbers here to them): weight streaming at 1-64 rows reaches 75.4% of the
# datasheet bandwidth, GEMMs from 1024 rows 67.2% of the bf16 rate, a small kernel takes
# 2.5 us, one GDN layer's tree verify + commit (`bole bench kernels`, experiments row R-9)
# runs at 21-78% of the speed its roofline prices, by batch and nodes a request. The other
# GPUs take the same fractions of their datasheet figures (no device measured here;
# datasheets in bole_cli.catalog.hardware) and launch_s a layer for the gaps, not the
# runtime's measured launches: their estimates describe an engine that
# launches about what the rooflines price (the paper's), the H200's the runtime calibrate
# measures. l2_bytes: datasheet L2 (A100 40 MB, H100/H200 50 MB, B200 126 MB; GB10 24 MB
# assumed).
H200_BW, H200_FLOPS = 0.754, 0.672  # EFFICIENCY["h200"]'s fractions, applied to every GPU
# One GDN layer's tree verify + commit (served default, random trees of depth <= 8, Qwen3.5-9B
# shape) at each (batch, nodes a request) of `bole bench kernels`' grid: the share of its
# roofline's speed (components.gdn_tree_cells of experiments/results/components/h200-9b-gdn-grid.json)
H200_GDN_TREE_CELLS = (
    (1.0, 2.0, 0.395), (1.0, 4.0, 0.383), (1.0, 8.0, 0.331), (1.0, 16.0, 0.314),
    (1.0, 32.0, 0.205), (1.0, 64.0, 0.205), (4.0, 2.0, 0.393), (4.0, 4.0, 0.385),
    (4.0, 8.0, 0.355), (4.0, 16.0, 0.351), (4.0, 32.0, 0.268), (4.0, 64.0, 0.301),
    (16.0, 2.0, 0.684), (16.0, 4.0, 0.647), (16.0, 8.0, 0.576), (16.0, 16.0, 0.566),
    (16.0, 32.0, 0.407), (16.0, 64.0, 0.52), (64.0, 2.0, 0.781), (64.0, 4.0, 0.738),
    (64.0, 8.0, 0.675), (64.0, 16.0, 0.7), (64.0, 32.0, 0.55), (64.0, 64.0, 0.578))
# GEMM time over its roofline's against compute time / streaming time (components.gemm_knee of
# experiments/results/components/h200-9b-r14.json: 1-4096 rows, dense through the knee, R-14):
# up to 1.18x its roofline around the ridge (x = 1, ~190 rows at 9B)
H200_GEMM_KNEE = ((0.0054, 1.0), (0.0109, 1.001), (0.0218, 1.003), (0.0436, 1.022), (0.0871, 1.005),
                  (0.1307, 1.007), (0.1743, 1.011), (0.2614, 1.024), (0.3486, 1.019), (0.5229, 1.046),
                  (0.6972, 1.084), (0.8715, 1.151), (1.0458, 1.183), (1.3943, 1.09), (1.7429, 1.123),
                  (2.0915, 1.051), (2.7887, 1.02), (4.183, 1.005), (5.5774, 0.994), (11.1548, 1.017),
                  (22.3096, 0.996))
_HOPPER_MEASURED = ("fractions of the datasheet measured on one H200 by component "
                    "microbenchmarks (weight streaming 75.4%, GEMMs from 1024 rows 67.2%)")
EFFICIENCY: dict[str, Efficiency] = {
    "a100": Efficiency(
        bw=H200_BW, flops=H200_FLOPS, launch_s=8e-6, kernel_floor_s=3e-6, l2_bytes=40e6,
        why="The H200's " + _HOPPER_MEASURED + "; launch gaps as on Ampere (8 us per "
            "layer, assumed). Not fitted."),
    "h100": Efficiency(
        bw=H200_BW, flops=H200_FLOPS, launch_s=6e-6, kernel_floor_s=3e-6, l2_bytes=50e6,
        why="The H200's " + _HOPPER_MEASURED + " (same SM). Not fitted."),
    "h200": Efficiency(
        bw=H200_BW, flops=H200_FLOPS, launch_s=6e-6, kernel_floor_s=2.55e-6, l2_bytes=50e6,
        host_step_s=3.1e-5, gdn_tree_cells=H200_GDN_TREE_CELLS, gemm_knee=H200_GEMM_KNEE,
        runtime=RuntimeLaunches(decode_launches_per_layer=10.84, verify_launches_per_layer=13.28,
                                gap_s=0.61e-6, decode_host_s=0.14e-3, verify_host_s=0.13e-3,
                                rows_decode_launches_per_layer=11.66),
        why="Measured here by component microbenchmarks (experiments/README.md rows R-9, R-14 "
            "and R-15, re-derived by bole_cli.calibrate.components): weight streaming at 1-64 "
            "rows 75.4% of the datasheet bandwidth, GEMMs from 1024 rows 67.2% of its bf16 rate, a "
            "small kernel 2.5 us, the GDN tree verify + commit at 21-78% of its roofline's speed by "
            "batch and tree size (latency-bound at these sizes), and the runtime's launches per layer, replay gaps "
            "and host share of a serving step. Not fitted to the profiles it predicts."),
    "gb10": Efficiency(
        bw=H200_BW, flops=H200_FLOPS, launch_s=8e-6, kernel_floor_s=4e-6, l2_bytes=24e6,
        why="The H200's " + _HOPPER_MEASURED + ", applied to GB10's dense bf16 rate (125 "
            "TFLOP/s, bole_cli.catalog.hardware) and 273 GB/s LPDDR5x; a slower launch "
            "path assumed. Not fitted."),
    "b200": Efficiency(
        bw=H200_BW, flops=H200_FLOPS, launch_s=6e-6, kernel_floor_s=3e-6, l2_bytes=126e6,
        why="The H200's " + _HOPPER_MEASURED + ". Not fitted."),
}
DEFAULT_EFFICIENCY = Efficiency(
    bw=H200_BW, flops=H200_FLOPS, launch_s=6e-6, kernel_floor_s=3e-6, l2_bytes=40e6,
    why="The H200's " + _HOPPER_MEASURED + ", for a GPU without its own entry.")


def efficiency_for(gpu: GpuSpec) -> Efficiency:
    return EFFICIENCY.get(gpu.key, DEFAULT_EFFICIENCY)


def _interp_log(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear in log x through sorted (x, y) points, clamped at both ends."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return pts[-1][1]


def _interp_log2d(cells: tuple[tuple[float, float, float], ...], a: float, b: float) -> float:
    """Bilinear in (log a, log b) over a full grid of (a, b, value) cells, clamped."""
    rows = sorted({ca for ca, _, _ in cells})
    return _interp_log(tuple((ca, _interp_log(tuple((cb, v) for ka, cb, v in cells if ka == ca), b))
                             for ca in rows), a)


# ---- the forward's shapes ----------------------------------------------------------------
def _layer_matmuls(m: ModelSpec, attention: bool) -> list[tuple[int, int, float, float]]:
    """(in, out, weight copies read, copies each token multiplies) of one layer's
    attention or GDN projections."""
    h = m.hidden
    if attention:
        q = m.attn_heads * m.attn_head_dim
        kv = m.attn_kv_heads * m.attn_head_dim
        shapes = [(h, 2 * q), (h, kv), (h, kv), (q, h)]  # q_proj emits query and gate
    else:
        hk = m.gdn_key_heads * m.gdn_key_dim
        hv = m.gdn_value_heads * m.gdn_value_dim
        shapes = [(h, 2 * hk + hv), (h, hv), (h, m.gdn_value_heads), (h, m.gdn_value_heads),
                  (hv, h)]
    return [(i, o, 1.0, 1.0) for i, o in shapes]


def _mlp_matmuls(m: ModelSpec, tokens: int) -> list[tuple[int, int, float, float]]:
    """Same for one layer's MLP. MoE: the weights of the experts `tokens` tokens touch,
    E * (1 - (1 - k/E)^T), are read; each token multiplies through k experts."""
    h = m.hidden
    if not m.is_moe:
        return [(h, m.ffn, 2.0, 2.0), (m.ffn, h, 1.0, 1.0)]  # gate + up, down
    e, k = m.experts, m.experts_top_k
    touched = e * (1.0 - (1.0 - k / e) ** tokens)
    out = [(h, e, 1.0, 1.0),  # router
           (h, m.expert_ffn, 2 * touched, 2.0 * k), (m.expert_ffn, h, touched, float(k))]
    if m.shared_expert_ffn:
        out += [(h, m.shared_expert_ffn, 2.0, 2.0), (m.shared_expert_ffn, h, 1.0, 1.0),
                (h, 1, 1.0, 1.0)]
    return out


@dataclass
class Cost:
    bytes: float = 0.0  # device-memory traffic: weights, KV cache, recurrent state, factors
    flops: float = 0.0
    act: float = 0.0  # activation traffic: served by L2 while it fits, else device memory


class RooflineForward:
    """The cost model behind the `StepTimer` protocol (bole_cli.calibrate.sweep.StepTimer)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, eff: Optional[Efficiency] = None, *,
                 draft_vocab: Optional[int] = None, check_memory: bool = False):
        """draft_vocab: the drafter's hot tokens (its LM head's rows), None for all.
        check_memory: a step that does not fit the GPU's memory (the datasheet's) raises
        BoleError as the measured runtime's does, so the sweep reports the cell instead of
        pricing it (bole_cli.footprint)."""
        self.model = model
        self.gpu = gpu
        self.eff = eff or efficiency_for(gpu)
        self.draft_vocab = draft_vocab
        self.check_memory = check_memory
        self.device_name = f"{gpu.name} (roofline model)"

    # each component is one roofline, and no kernel is shorter than the floor
    def _time(self, c: Cost, kernels: int = 1) -> float:
        dram = c.bytes + (c.act if c.act > 0.5 * self.eff.l2_bytes else 0.0)
        return max(dram / (self.gpu.mem_bandwidth * self.eff.bw),
                   c.flops / (self.gpu.bf16_flops * self.eff.flops),
                   kernels * self.eff.kernel_floor_s)

    def _gemm_time(self, weight_bytes: float, flops: float, act: float) -> float:
        """One GEMM: its roofline, times the measured knee at its x (compute over weight
        streaming, eff.gemm_knee)."""
        roof = self._time(Cost(bytes=weight_bytes, flops=flops, act=act))
        if not self.eff.gemm_knee:
            return roof
        x = (flops / (self.gpu.bf16_flops * self.eff.flops)) / (weight_bytes / (self.gpu.mem_bandwidth * self.eff.bw))
        return roof * _interp_log(self.eff.gemm_knee, x)

    def _gdn_share(self, batch: int, nodes: float) -> float:
        """The GDN tree verify + commit's share of its roofline's speed at this batch and
        nodes a request (eff.gdn_tree_cells where measured, else 1)."""
        cells = self.eff.gdn_tree_cells
        if not cells:
            return 1.0
        return _interp_log2d(cells, batch, nodes)

    def components(self, batch: int, kv_len: int, tokens: int, verify: bool) -> dict[str, float]:
        """Seconds per component for one forward over `tokens` tokens of `batch` requests."""
        m = self.model
        T = tokens
        n = T / batch  # tokens per request
        t: dict[str, float] = {}

        def matmul_time(shapes, count: int) -> float:
            total = 0.0
            for i, o, w_copies, f_copies in shapes:
                total += self._gemm_time(i * o * w_copies * BF16, 2.0 * T * i * o * f_copies,
                                         T * (i + o) * BF16 * f_copies)
            return total * count

        n_attn, n_gdn = m.n_attention_layers, m.n_gdn_layers
        t["matmul.attention"] = matmul_time(_layer_matmuls(m, True), n_attn)
        t["matmul.gdn"] = matmul_time(_layer_matmuls(m, False), n_gdn)
        t["matmul.mlp"] = matmul_time(_mlp_matmuls(m, T), m.layers)
        t["matmul.lm_head"] = matmul_time([(m.hidden, m.vocab, 1.0, 1.0)], 1)

        # full attention over the KV cache (+ the tree block)
        hd, hq, hkv = m.attn_head_dim, m.attn_heads, m.attn_kv_heads
        kv_bytes = batch * kv_len * 2 * hkv * hd * BF16
        io_bytes = T * (2 * hkv * hd + 2 * hq * hd) * BF16
        attn_flops = 4.0 * T * hq * hd * (kv_len + n)
        t["attention"] = n_attn * self._time(Cost(kv_bytes, attn_flops, act=io_bytes)) / self._attention_share(
            batch, kv_len, n)

        # GDN core
        hv, dk, dv = m.gdn_value_heads, m.gdn_key_dim, m.gdn_value_dim
        state = batch * hv * dk * dv * FP32
        qkv_io = T * (m.conv_dim + 2 * hv * dv + 2 * hv) * BF16  # q|k|v, z, g, beta in; o out
        if verify:
            d = min(max(n - 1.0, 0.0), MAX_TREE_DEPTH)
            factors = T * (m.gdn_key_heads * dk + hv * dv + hv) * FP32 * 2
            # the replay commit: decay, k . S and the rank-1 update for each of the d + 1 path nodes
            flops = batch * hv * (4 * n * dk * dv + 4 * n * n * dk + 2 * n * n * dv * (d + 1)
                                  + 6 * (d + 1) * dk * dv)
            core, kernels = Cost(3 * state + factors, flops, act=qkv_io), 2  # verify + commit
        else:
            core, kernels = Cost(2 * state, 8.0 * batch * hv * dk * dv, act=qkv_io), 1
        conv = Cost(batch * m.conv_dim * (m.conv_kernel - 1) * BF16 * 2, 0.0)
        if verify:
            layer = self._time(core, kernels) / self._gdn_share(batch, n) + self._time(conv)
        else:  # one fused kernel: conv window, gates, recurrence and norm
            share = _interp_log(self.eff.gdn_decode_cells, batch) if self.eff.gdn_decode_cells else 1.0
            layer = (self._time(core, kernels) + self._time(conv)) / share
        t["gdn_core"] = n_gdn * layer

        # two fused add + RMSNorm kernels per layer, 4 passes each
        t["norms"] = m.layers * self._time(Cost(act=8.0 * T * m.hidden * BF16), 2)
        t["logits"] = self._time(Cost(act=T * m.vocab * (BF16 + FP32)))  # fp32 cast
        t["launch"] = self._launches(verify, T)
        return t

    def _attention_share(self, batch: int, kv_len: int, tokens: float, *, drafter: bool = False) -> float:
        """The attention over the KV cache's share of its roofline's speed (eff.attention_cells,
        by keys read and query rows a (request, KV head); 1 where unmeasured); the drafter's
        level by its own cells (its rows unmasked) where measured, else the target's: both
        read their caches through the same kernel."""
        cells = (drafter and self.eff.draft_attention_cells) or self.eff.attention_cells
        return _interp_log2d(cells, batch * kv_len, tokens * self.model.attn_group) if cells else 1.0

    def _priced_kernels(self, verify: bool) -> int:
        """The kernels `components` prices a roofline each (matmuls, attention, GDN core and
        conv, two norms a layer, the LM head and the logits)."""
        m = self.model
        mlp = len(_mlp_matmuls(m, 1))
        # the attention: one roofline; where measured (its share), its part and merge kernels
        attn = len(_layer_matmuls(m, True)) + mlp + (2 if self.eff.attention_cells else 1) + 2
        gdn = len(_layer_matmuls(m, False)) + mlp + (2 if verify else 1) + 1 + 2
        return m.n_attention_layers * attn + m.n_gdn_layers * gdn + 2

    def _launches(self, verify: bool, rows: int) -> float:
        """Launch costs: eff.launch_s a layer, or, where the runtime's launches were measured
        (eff.runtime), each launch the roofline does not price at the kernel floor, every
        launch's replay gap and the host's share of a serving step; a decode of `rows` rows
        launches the one-row count up to limits.SKINNY_DEFAULT_MAX_ROWS rows, more beyond."""
        r, m = self.eff.runtime, self.model
        if r is None:
            return self.eff.launch_s * (m.layers + 2)
        if verify:
            per_layer = r.verify_launches_per_layer
        else:
            per_layer = r.decode_launches_per_layer if rows <= SKINNY_DEFAULT_MAX_ROWS \
                else r.rows_decode_launches_per_layer
        launches = m.layers * per_layer
        unpriced = max(0.0, launches - self._priced_kernels(verify))
        host = r.verify_host_s if verify else r.decode_host_s
        return unpriced * self.eff.kernel_floor_s + launches * r.gap_s + host

    def draft_components(self, batch: int, kv_len: int, rows: int,
                         draft_vocab: Optional[int] = None) -> dict[str, float]:
        """Seconds per component of one drafter level over `rows` rows per request: the MTP
        layer (fc over [embedding | hidden], one gated-attention layer, the MLP) and the
        shared LM head (or `draft_vocab` hot rows of it) read once, the layer's KV cache of
        the context read, the logits' softmax and top-k; at least `draft_kernels` kernels."""
        m = self.model
        T = batch * rows
        h, hq, hk, dh = m.hidden, m.attn_heads, m.attn_kv_heads, m.attn_head_dim
        ffn = m.ffn or (m.experts_top_k * m.expert_ffn + m.shared_expert_ffn)
        vocab = draft_vocab or self.draft_vocab or m.vocab
        t: dict[str, float] = {}
        shapes = [(2 * h, h), (h, 2 * hq * dh + 2 * hk * dh), (hq * dh, h), (h, 2 * ffn),
                  (ffn, h), (h, vocab)]
        t["matmul"] = sum(self._gemm_time(i * o * BF16, 2.0 * T * i * o, T * (i + o) * BF16)
                          for i, o in shapes)
        kv = batch * (kv_len + rows) * 2 * hk * dh * BF16
        t["attention"] = self._time(Cost(kv, 4.0 * T * hq * dh * (kv_len + rows))) / self._attention_share(
            batch, kv_len, rows, drafter=True)
        t["logits"] = self._time(Cost(act=T * vocab * (BF16 + 2 * FP32)))  # softmax, top-k
        floor = self.eff.draft_kernels * self.eff.kernel_floor_s
        if self.eff.runtime is None:
            t["launch"] = max(0.0, floor - sum(t.values()))
        else:  # measured launches: the unpriced kernels at the floor, every launch's gap
            unpriced = max(0, self.eff.draft_kernels - len(shapes) - 2)
            t["launch"] = unpriced * self.eff.kernel_floor_s + self.eff.draft_kernels * self.eff.runtime.gap_s
        return t

    def time_draft_level(self, batch: int, kv_len: int, rows: int) -> float:
        """One drafter level (see draft_components), for the decision's T_draft."""
        return sum(self.draft_components(batch, kv_len, rows).values())

    def time_sample(self, batch: int, tokens: int) -> float:
        """Sampling a step: the target's argmax over `tokens` rows of logits and the tokens'
        trip to the host (eff.host_step_s)."""
        read = Cost(bytes=tokens * self.model.vocab * BF16)
        return self.eff.host_step_s + self._time(read)

    def memory(self, batch: int, kv_len: int, n_tree_tokens: int = 0) -> dict[str, int]:
        """Bytes a step holds (bole_cli.footprint, bf16 with a float32 state); a verify also
        the drafter's weights and cache, which speculation needs beside the target."""
        need = step_memory(self.model, BF16, FP32, batch=batch, kv_len=kv_len, n_tree_tokens=n_tree_tokens)
        if n_tree_tokens:
            need.update(drafter_memory(self.model, BF16, batch=batch, kv_len=kv_len))
            need["total"] = sum(v for k, v in need.items() if k != "total")
        return need

    def _require(self, batch: int, kv_len: int, n_tree_tokens: int = 0) -> None:
        if not self.check_memory:
            return
        need = self.memory(batch, kv_len, n_tree_tokens)
        if need["total"] > self.gpu.memory_bytes:
            what = f"batch {batch}, kv_len {kv_len}" + (f", {n_tree_tokens} tree tokens" if n_tree_tokens else "")
            raise does_not_fit(self.model.name, what, need, self.gpu.memory_bytes, f"one {self.gpu.name}")

    # ---- the StepTimer protocol ----------------------------------------------------------------
    def time_decode(self, batch: int, kv_len: int) -> float:
        self._require(batch, kv_len)
        return sum(self.components(batch, kv_len, batch, verify=False).values())

    def time_verify(self, batch: int, kv_len: int, n_tree_tokens: int) -> float:
        self._require(batch, kv_len, n_tree_tokens)
        return sum(self.components(batch, kv_len, n_tree_tokens, verify=True).values())

    def info(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "efficiency": self.eff.to_dict(),
            "gpu_datasheet": {"bf16_flops": self.gpu.bf16_flops,
                              "mem_bandwidth": self.gpu.mem_bandwidth},
        }
