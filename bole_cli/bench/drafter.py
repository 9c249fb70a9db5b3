"""The drafter of `bole bench e2e`: an MTP-style head grown into an EAGLE beam tree.

What it is: one extra decoder layer at the target's hidden size (gated full attention
with q/k RMSNorm and partial RoPE, then the MLP), fed by fc([norm(embed(token)) |
norm(hidden)]) as Qwen3.5's MTP layer is, and the target's own embedding and LM head
(shared, as the MTP head shares them). It runs `depth` times per decoding step:

- level 1 runs on each request's root (the last committed token) and takes the top-k
  tokens of its logits (those of its softmax): the root's k children;
- level l > 1 runs on the k "beam" nodes of level l-1 (the best k by path score) and
  takes the top-k tokens of each: k*k children.

The tree's SHAPE (which nodes the beam expands) and the draft probabilities come from
the acceptance model (DraftLayout), not from the random-weight head: acceptance in
`bole bench e2e` is simulated, and a calibrated drafter's draft probability of a node is
its acceptance probability. The head's work is real and its TOKENS are real (top-k of
its logits), so its cost and the verify's inputs are what a serving engine would have.

Simplifications that do not change the cost: the head's hidden input at the root is a
fixed random vector (the runtime does not expose the target's last hidden state); its
attention reads its own KV cache of the committed context (random, `context` long, not
extended by accepted tokens) plus the draft rows written so far in the step, without a
tree mask (the head only chooses token ids; exactness is the verifier's business). Where
the target reads its KV cache through the split-key kernel (`HybridModel.cache_kernel`: CUDA,
16-bit), so does the head: one program per request and KV head would leave the GPU idle
over a long context.

A reduced draft vocabulary (`draft_vocab`, SGLang's `--speculative-token-map`): the head
scores only `draft_vocab` hot tokens (an LM head of that many rows) and maps its top-k
back to token ids. Which tokens are hot does not change the cost; with random weights the
first `draft_vocab` ids stand in for a frequency-ranked map.

Everything after `new_state` is device-only (no host sync), so `forward` can be captured
in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from bole_cli.errors import InputError
from bole_cli.footprint import drafter_param_bytes
from bole_cli.limits import DRAFT_TOPK_MAX_K
from bole_cli.parsing import check_int
from bole_cli.runtime.attention import cache_attention
from bole_cli.runtime.batch import Rope
from bole_cli.runtime.fusion import RMS_EPS, NormedRows
from bole_cli.runtime.model import HybridModel
from bole_cli.trees import ProposalTree, check_beam_tree_size


@dataclass(frozen=True)
class DraftLayout:
    """The beam tree the drafter grows every step (fixed by the per-depth probabilities).

    Node order is `bole_cli.trees.beam_tree`'s: node 0 the root, then level by level; a
    level's children come in the order of their parent's beam rank, each parent's k
    children in rank order. `frontier[l]` (l = 0 .. depth-2) lists, in beam order, the
    positions within level l+1's nodes that level l+2 expands.
    """

    depth: int
    topk: int
    tree: ProposalTree  # parents + draft log-probs
    level_start: tuple[int, ...]  # node id of level l+1's first node, l = 0 .. depth-1
    level_rows: tuple[int, ...]  # drafter rows per request at level l+1 (1, then topk)
    frontier: tuple[tuple[int, ...], ...]
    node_depth: tuple[int, ...]  # strict ancestors (0 for the root)
    node_rank: tuple[int, ...]  # rank among siblings (-1 for the root)
    children: tuple[tuple[int, ...], ...]  # children by rank ((), when not expanded)

    @property
    def n_nodes(self) -> int:
        return self.tree.n_nodes


def build_layout(depth: int, topk: int, level_probs: Sequence[Sequence[float]]) -> DraftLayout:
    """The beam tree for `depth` levels of `topk` drafts, child r of any node at level l
    having draft probability level_probs[l][r] (the same tree as trees.beam_tree)."""
    if not isinstance(depth, int) or depth < 1:
        raise InputError(f"--depth must be a positive integer, got {depth!r}")
    if not isinstance(topk, int) or topk < 1:
        raise InputError(f"--topk must be a positive integer, got {topk!r}")
    check_beam_tree_size(depth, topk, f"depth {depth} with top-k {topk}")
    if len(level_probs) < depth or any(len(r) < topk for r in level_probs[:depth]):
        raise InputError(f"the acceptance model gives {len(level_probs)} depths; "
                         f"depth {depth} and top-k {topk} need {depth} depths of {topk} ranks")
    parents, log_probs, score = [-1], [0.0], [0.0]
    ndepth, rank = [0], [-1]
    starts, rows, frontier_pos = [], [], []
    frontier = [0]
    for lvl in range(depth):
        start = len(parents)
        starts.append(start)
        rows.append(len(frontier))
        new = []
        for node in frontier:
            for r in range(topk):
                p = float(level_probs[lvl][r])
                lp = math.log(p)
                parents.append(node)
                log_probs.append(lp)
                score.append(score[node] + lp)
                ndepth.append(lvl + 1)
                rank.append(r)
                new.append(len(parents) - 1)
        frontier = sorted(new, key=lambda i: (-score[i], i))[:topk]
        if lvl < depth - 1:
            frontier_pos.append(tuple(i - start for i in frontier))
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return DraftLayout(depth, topk, ProposalTree(parents, log_probs), tuple(starts), tuple(rows),
                       tuple(frontier_pos), tuple(ndepth), tuple(rank), tuple(tuple(k) for k in kids))


@dataclass
class DraftState:
    """Per-batch drafter buffers; the graph's static inputs and outputs."""

    batch: int
    context: int
    kv: torch.Tensor  # [2, B, H_kv, context + scratch, head_dim]
    hidden: torch.Tensor  # [B, hidden]: the root's hidden input
    pending: torch.Tensor  # [B] int64: each request's root token (last committed token)
    cos: list[torch.Tensor]  # per level [1, rope/2]
    sin: list[torch.Tensor]
    frontier: list[torch.Tensor]  # per level > 1: int64 positions of the expanded parents
    parent_row: list[torch.Tensor]  # per level > 1: the previous level's row of each parent
    kv_index: dict = field(default_factory=dict)  # (rows, position) -> a level's index vectors


class MTPDrafter:
    """An MTP-style draft head on a HybridModel (shares its embedding and LM head)."""

    def __init__(self, model: HybridModel, layout: DraftLayout, *, seed: int = 4321,
                 draft_vocab: "int | None" = None, topk_kernel: "bool | None" = None):
        """topk_kernel: a level's top-k through kernels.draft_topk (two launches, the hot-token
        map in the second) instead of torch.topk and an index; default: on CUDA, for beams of
        up to limits.DRAFT_TOPK_MAX_K (True for a wider beam: InputError)."""
        self.model, self.layout = model, layout
        s = model.spec
        check_int(draft_vocab, "--draft-vocab", maximum=s.vocab)
        self.draft_vocab = draft_vocab or s.vocab
        # the head's LM head: the target's, or its hot-token rows (a view: no copy, no extra weights)
        self.lm_head = model.lm_head[: self.draft_vocab]
        self.hot_ids = (None if self.draft_vocab == s.vocab
                        else torch.arange(self.draft_vocab, device=model.device, dtype=torch.int64))
        self.device, self.dtype = model.device, model.dtype
        ranks = min(DRAFT_TOPK_MAX_K, self.draft_vocab)  # the most drafts the kernel ranks here
        fits = layout.topk <= ranks
        if topk_kernel and not fits:
            raise InputError(f"topk_kernel: the kernel ranks 1..{ranks} drafts (limits.DRAFT_TOPK_MAX_K and the "
                             f"draft vocabulary), the beam takes {layout.topk}")
        self.topk_kernel = (self.device.type == "cuda" and fits) if topk_kernel is None else bool(topk_kernel)
        h, hq, hk, dh = s.hidden, s.attn_heads, s.attn_kv_heads, s.attn_head_dim
        self.ffn = s.ffn or (s.experts_top_k * s.expert_ffn + s.shared_expert_ffn)  # MoE: active width
        gen = torch.Generator(device=self.device).manual_seed(seed)
        out_scale = 0.5 ** 0.5

        def lin(o, i, scale=1.0):
            w = torch.randn((o, i), generator=gen, device=self.device, dtype=self.dtype)
            return w.mul_(scale * i ** -0.5)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=self.dtype)

        self.w = dict(
            emb_norm=ones(h), hid_norm=ones(h), fc=lin(h, 2 * h),
            input_norm=ones(h), qkv=lin(2 * hq * dh + 2 * hk * dh, h), q_norm=ones(dh), k_norm=ones(dh),
            o_proj=lin(h, hq * dh, out_scale), post_norm=ones(h),
            gate_up=lin(2 * self.ffn, h), down=lin(h, self.ffn, out_scale), final_norm=ones(h),
        )
        self.rope: Rope = model.rope
        self._gen = gen

    @property
    def hot_vocab(self) -> "int | None":
        """The hot tokens it drafts over, None for the full vocabulary (as profiles record it)."""
        return None if self.hot_ids is None else self.draft_vocab

    @property
    def param_bytes(self) -> int:
        """The head's own weights (the embedding and LM head are the target's)."""
        return sum(t.numel() * t.element_size() for t in self.w.values())

    def level_read_bytes(self, batch: int, context: int, rows: int = 1) -> int:
        """Bytes one level must read: the head's weights, its LM head (the draft vocabulary's
        rows), `rows` embedding rows and the KV of the context per request (the floor of
        `bole bench e2e`'s drafter line)."""
        s, el = self.model.spec, self.lm_head.element_size()
        kv = 2 * batch * s.attn_kv_heads * context * s.attn_head_dim * el
        return self.param_bytes + self.lm_head.numel() * el + batch * rows * s.hidden * el + kv

    @staticmethod
    def param_bytes_for(spec, dtype: torch.dtype) -> int:
        return drafter_param_bytes(spec, torch.empty((), dtype=dtype).element_size())

    def scratch(self) -> int:
        """KV rows one step writes past the context: every level's input rows."""
        return sum(self.layout.level_rows)

    def new_state(self, batch: int, context: int, *, seed: int = 7) -> DraftState:
        s, dev = self.model.spec, self.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        kv = torch.empty(2, batch, s.attn_kv_heads, context + self.scratch(), s.attn_head_dim,
                         device=dev, dtype=self.dtype)
        kv.normal_(0.0, 1.0, generator=gen)
        hidden = torch.randn(batch, s.hidden, generator=gen, device=dev, dtype=self.dtype)
        cos, sin = [], []
        for lvl in range(self.layout.depth):
            c, si = self.rope.tables(torch.tensor([context + lvl], device=dev))
            cos.append(c)
            sin.append(si)
        k = self.layout.topk
        frontier = [torch.tensor(f, dtype=torch.int64, device=dev) for f in self.layout.frontier]
        parent_row = [torch.div(f, k, rounding_mode="floor") for f in frontier]
        return DraftState(batch, context, kv, hidden, torch.zeros(batch, dtype=torch.int64, device=dev),
                          cos, sin, frontier, parent_row)

    # ---- the forward -------------------------------------------------------------------
    def _level(self, st: DraftState, lvl: int, tokens: torch.Tensor, hidden: torch.Tensor, kv_off: int):
        """One pass of the head over B*R rows (R per request). tokens [B, R], hidden
        [B, R, h] -> (output hidden [B, R, h], top-k token ids [B, R, k])."""
        s, w, fuse = self.model.spec, self.w, self.model.fuse  # the target's fused pieces
        bsz, rows = tokens.shape
        n = bsz * rows
        hq, hk, dh, h = s.attn_heads, s.attn_kv_heads, s.attn_head_dim, s.hidden
        grp = hq // hk
        x = fuse.mtp_in(tokens.reshape(n), self.model.embed, hidden.reshape(n, h), w["emb_norm"], w["hid_norm"])
        proj = self.model.project  # the target's projection path (cuBLAS, or the skinny GEMM)
        x = proj(x, w["fc"], "fc")
        cos, sin = st.cos[lvl].expand(n, -1), st.sin[lvl].expand(n, -1)
        # the norms and residual adds as the target's layers take them (NormedRows: fused into
        # the next projection by the skinny GEMM, else computed before it)
        qkv = proj(NormedRows(x, None, w["input_norm"], fuse), w["qkv"], "qkv")
        pos = st.context + kv_off
        if kv_off < 0 or pos + rows > st.kv.shape[3]:
            raise InputError(f"kv_off: rows {pos}..{pos + rows - 1} lie past the head's KV cache "
                             f"({st.kv.shape[3]} positions: the context and the step's scratch)")
        if self.model.attention_in_kernel:  # norms, RoPE and the KV write in one launch, as the target's
            from bole_cli.kernels.attention_in import attention_in

            slots, positions, _, _ = self._level_index(st, rows, pos)
            q, gate, _, _ = attention_in(qkv, w["q_norm"], w["k_norm"], cos, sin, st.kv[0], st.kv[1], slots,
                                         positions, heads=hq, kv_heads=hk, eps=RMS_EPS)
        else:
            q, gate, k, v = fuse.attn_in(qkv, w["q_norm"], w["k_norm"], cos, sin, hq, hk, dh)
            st.kv[0, :, :, pos: pos + rows] = k.view(bsz, rows, hk, dh).transpose(1, 2)
            st.kv[1, :, :, pos: pos + rows] = v.view(bsz, rows, hk, dh).transpose(1, 2)
        qf = q.view(bsz, rows, hk, grp, dh).permute(0, 2, 1, 3, 4).reshape(bsz, hk, rows * grp, dh)
        if self.model.cache_kernel:  # split along the keys, as the target's decode reads its cache
            _, _, slots, used = self._level_index(st, rows, pos)
            o = cache_attention(qf, st.kv[0], st.kv[1], slots, used, pos + rows)[0]
        else:
            o = F.scaled_dot_product_attention(qf, st.kv[0, :, :, : pos + rows], st.kv[1, :, :, : pos + rows])
        o = o.view(bsz, hk, rows, grp, dh).permute(0, 2, 1, 3, 4).reshape(n, hq * dh)
        a = NormedRows(x, self.model.project_gated(o, gate, w["o_proj"]), w["post_norm"], fuse)
        mlp = proj(proj(a, w["gate_up"], "gate_up", glu=True), w["down"], "down")
        a = NormedRows(a.total(), mlp, w["final_norm"], fuse)
        logits = proj(a, self.lm_head, "lm_head")
        x = a.total()
        # the top-k of the logits themselves: the softmax is monotonic and only the indices
        # are drafted, so a full-vocabulary float32 softmax would only add bytes
        if self.topk_kernel:
            from bole_cli.kernels.draft_topk import draft_topk

            top = draft_topk(logits, self.layout.topk, token_map=self.hot_ids)  # [n, k]
        else:
            top = torch.topk(logits, self.layout.topk, dim=-1).indices
            if self.hot_ids is not None:
                top = self.hot_ids[top]
        return x.view(bsz, rows, h), top.view(bsz, rows, self.layout.topk)

    def _level_index(self, st: DraftState, rows: int, pos: int) -> tuple[torch.Tensor, ...]:
        """A level's index vectors: the KV slot (request) and position of each of its B x R
        rows, and for its attention each request's slot and keys used. Kept with the state
        once built eagerly (a captured level reads them, it does not rebuild them; ones built
        during a capture are the graph's and are not kept)."""
        key = (rows, pos)
        if key in st.kv_index:
            return st.kv_index[key]
        dev = self.device
        requests = torch.arange(st.batch, device=dev)
        index = (requests.repeat_interleave(rows), pos + torch.arange(rows, device=dev).repeat(st.batch), requests,
                 torch.full((st.batch,), pos + rows, dtype=torch.int64, device=dev))
        if not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            st.kv_index[key] = index
        return index

    def level(self, st: DraftState, lvl: int, tokens: torch.Tensor, hidden: torch.Tensor,
              kv_off: int):
        """One level alone (what `bole calibrate` times per level: docs/design.md §8)."""
        return self._level(st, lvl, tokens, hidden, kv_off)

    def forward(self, st: DraftState) -> torch.Tensor:
        """Draft every node of the beam tree: token ids [B, n_nodes] in layout order
        (column 0 is the root, st.pending)."""
        lay = self.layout
        bsz = st.batch
        out = [st.pending.view(bsz, 1)]
        tokens = st.pending.view(bsz, 1)
        hidden = st.hidden.view(bsz, 1, -1)
        off = 0
        for lvl in range(lay.depth):
            x, top = self._level(st, lvl, tokens, hidden, off)
            off += tokens.shape[1]
            flat = top.reshape(bsz, -1)  # children of this level, in layout order
            out.append(flat)
            if lvl < lay.depth - 1:
                tokens = flat.index_select(1, st.frontier[lvl])
                hidden = x.index_select(1, st.parent_row[lvl])
        return torch.cat(out, dim=1)

