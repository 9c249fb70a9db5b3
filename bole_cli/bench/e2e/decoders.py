"""The decoders `bole bench e2e` compares, each one step at a time over one batch.

1. autoregressive ("ar"): one decode step (one token) per request per step;
2. snapshot tree ("snapshot"): the drafted trees verified with SnapshotGDN, node by node
   with a full GDN state snapshot per node, the accepted snapshot copied back (SGLang
   0.5.23's serial verifier where its kernels load, else the PyTorch step loop);
3. Bole ("bole"): the same trees, verified with the closed form (tree_verify) and
   committed by replaying the accepted path (tree_commit_replay); docs/design.md §2, §3, §9;
4. ReplaySSM chain ("chain"): a depth-d top-1 MTP chain verified by SGLang 0.5.23's
   ReplaySSM in the protocol a GDN model runs, the circular ring (verify from checkpoint +
   ring history, commit = cursor advance + materialisation when due;
   bole_cli/runtime/replayssm.py, docs/sglang-0.5.23.md), and Bole's chain ("bole-chain"):
   the same chain through tree_verify + tree_commit_replay. A chain is the rank-1
   path of the same per-depth, per-rank acceptance matrix, drawn from the same per-step
   draws, so tree and chain are simulated consistently; the harness sweeps d.

A tree decoder's step: the drafter (bole_cli/bench/drafter.py) grows the beam tree, the
plan's budget keeps its nodes (plan.py), the target verifies them (one hybrid forward),
sampling takes the target's argmax at every node and walks the tree (acceptance.py), and
the commit makes the accepted path the committed prefix. A step returns its phase marks
(draft | verify | sample | commit, PHASES) and the host time spent preparing metadata.

Adding a decoder (a chain decoder verified by SGLang's ReplaySSM, say): subclass Decoder,
or TreeDecoder with its own `path` (and `plan_for` for a chain's plan), give it `name`,
`label` and `short_label`, list it in DECODER_CLASSES and its name in options.DECODER_NAMES
(the torch-free check and help of `--decoders`; a test holds the two equal); the harness,
the largest-batch probe and the report follow from the registry.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from bole_cli.bench.drafter import DraftState
from bole_cli.bench.e2e.simulated_acceptance import step_rng, walk_greedy, walk_simulated
from bole_cli.bench.e2e.tree_budget import TreePlan, plan_trees
from bole_cli.errors import InputError
from bole_cli.runtime.graphs import GraphCache
from bole_cli.runtime.model import HybridCache

PHASES = ("draft", "verify", "sample", "commit")


class PhaseClock:
    """Marks on the GPU timeline (CUDA events) or host time (CPU); elapsed after a sync."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


class Decoder:
    """Shared state of one decoder over one batch: cache, pending tokens, streams.

    `bench` is the harness's E2EBench: the model, the drafter, the acceptance model and
    the cache factory every decoder of a run shares."""

    name = ""
    label = ""  # in tables and progress lines
    short_label = ""  # in the narrow tables
    drafts = False  # drafts a tree: has a budget plan and an expected acceptance above 1
    chain = False  # a top-1 chain whose depth the harness sweeps (bench.chain_depth)

    def __init__(self, bench, batch: int, max_steps: int):
        self.bench, self.model = bench, bench.model
        self.batch = batch
        self.slots = list(range(batch))
        self.max_len = bench.max_len(max_steps)
        self.cache = bench.new_cache(batch, self.max_len)
        self.pending = bench.initial_tokens(batch)  # host list: each request's last token
        self.streams: list[list[int]] = [[] for _ in range(batch)]
        self.accepted: list[list[int]] = []  # per step: committed tokens per request
        self.graphs = GraphCache(bench.use_graphs, reason="CUDA graphs off (CPU or --no-graphs)")
        self.clock = PhaseClock(bench.device.type == "cuda")
        self.steps_done = 0

    @classmethod
    def build(cls, bench, batch: int, max_steps: int, *, override=None) -> "Decoder":
        return cls(bench, batch, max_steps)

    @classmethod
    def probe(cls, bench, cache: HybridCache, batch: int, nodes_per_request: int) -> None:
        """One eager step's allocations at `batch` (the largest-batch search); raises on failure."""
        raise NotImplementedError

    def step(self, *, eager: bool = False, mem: Optional[dict] = None) -> tuple[list, float]:
        raise NotImplementedError

    def _mem_start(self, mem):
        if mem is None or self.bench.device.type != "cuda":
            return None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def _mem_end(self, mem, base, key):
        if base is None:
            return
        torch.cuda.synchronize()
        mem[key] = torch.cuda.max_memory_allocated() - base

    def _record(self, emitted: list[list[int]]) -> None:
        for b, toks in enumerate(emitted):
            self.streams[b].extend(toks)
        self.accepted.append([len(t) for t in emitted])
        self.steps_done += 1


class ARDecoder(Decoder):
    name, label, short_label = "ar", "autoregressive", "AR"

    def __init__(self, bench, batch, max_steps):
        super().__init__(bench, batch, max_steps)
        self.pending_dev = torch.tensor(self.pending, dtype=torch.int64, device=bench.device)

    @classmethod
    def probe(cls, bench, cache, batch, nodes_per_request):
        logits = bench.model.decode(cache, torch.zeros(batch, dtype=torch.int64, device=bench.device))
        logits.argmax(-1)

    def _save(self):
        c, idx = self.cache, torch.tensor(self.slots, device=self.bench.device)
        saved = (c.gdn_state[:, idx].clone(), c.conv_state[:, idx].clone())

        def restore():
            c.gdn_state[:, idx] = saved[0]
            c.conv_state[:, idx] = saved[1]
        return restore

    def step(self, *, eager=False, mem=None):
        m, c = self.model, self.clock
        marks = [c.mark()]
        marks.append(c.mark())  # no draft
        base = self._mem_start(mem)
        t0 = time.perf_counter()
        db = m.prepare_decode(self.cache, self.pending_dev, self.slots, kv_bucket=self.max_len)
        prep = time.perf_counter() - t0
        if eager:
            logits = m.forward_decode(self.cache, db)
        else:
            logits = self.graphs.run(("decode",) + db.signature(), db,
                                     lambda p: m.forward_decode(self.cache, p), save=self._save)
        marks.append(c.mark())
        nxt = logits.argmax(-1)
        host = nxt.tolist()  # the engine's sync: the sampled tokens come back
        marks.append(c.mark())
        for s in self.slots:
            self.cache.kv_lens[s] += 1
        self.pending_dev, self.pending = nxt, host
        self._record([[t] for t in host])
        marks.append(c.mark())
        self._mem_end(mem, base, "verify_peak")
        return marks, prep


class TreeDecoder(Decoder):
    """Draft, budget-selected verify (HybridModel.forward_verify's `path`), sample, commit."""

    path = ""
    drafts = True

    def __init__(self, bench, batch, max_steps, plan: TreePlan,
                 override: Optional[Callable[["TreeDecoder", torch.Tensor], torch.Tensor]] = None):
        super().__init__(bench, batch, max_steps)
        self.plan = plan
        self.drafter = self.drafter_for(bench)
        self.dstate: DraftState = self.drafter.new_state(batch, bench.context, seed=bench.seed + 11)
        self.dstate.pending.copy_(torch.tensor(self.pending, dtype=torch.int64))
        self.kept_index = torch.tensor(plan.kept_index, dtype=torch.int64, device=bench.device)
        self.override = override  # tests: replace the drafted tokens (an oracle drafter)
        self.cu = list(plan.forest.cu_seqlens)

    @classmethod
    def plan_for(cls, bench, batch: int) -> TreePlan:
        """The batch's budget-selected trees (the bench's budget policy)."""
        return bench.plan(batch)

    @classmethod
    def drafter_for(cls, bench):
        """The drafter growing this decoder's tree (the bench's beam-tree drafter)."""
        return bench.drafter

    @classmethod
    def build(cls, bench, batch, max_steps, *, override=None):
        return cls(bench, batch, max_steps, cls.plan_for(bench, batch), override=override)

    @classmethod
    def probe(cls, bench, cache, batch, nodes_per_request):
        plan = plan_trees(bench.layout, batch, nodes_per_request * batch)
        st = bench.drafter.new_state(batch, bench.context)
        toks = bench.drafter.forward(st).view(-1)
        kept = toks.index_select(0, torch.tensor(plan.kept_index, device=bench.device))
        out = bench.model.verify(cache, plan.forest, kept, path=cls.path)
        out.logits.argmax(-1)
        bench.model.commit(cache, out, [0] * batch)

    @staticmethod
    def verify_state(out) -> list:
        """The verify's per-step state buffers (what `verify_state_bytes` counts)."""
        raise NotImplementedError

    def _draft(self):
        toks = self.drafter.forward(self.dstate)
        return toks, toks.view(-1).index_select(0, self.kept_index)

    def step(self, *, eager=False, mem=None):
        m, c, plan, lay = self.model, self.clock, self.plan, self.plan.layout
        marks = [c.mark()]
        base = self._mem_start(mem)
        toks, kept = self._draft() if eager else self.graphs.run(("draft",), None, lambda _: self._draft())
        if self.override is not None:
            toks = self.override(self, toks.clone())
            kept = toks.view(-1).index_select(0, self.kept_index)
        self._mem_end(mem, base, "draft_peak")
        marks.append(c.mark())
        base = self._mem_start(mem)
        t0 = time.perf_counter()
        tb = m.prepare_verify(self.cache, plan.forest, kept, self.slots, kv_bucket=self.max_len)
        prep = time.perf_counter() - t0
        if eager:
            out = m.forward_verify(self.cache, tb, path=self.path)
        else:
            out = self.graphs.run(("verify", self.path) + tb.signature(), tb,
                                  lambda p: m.forward_verify(self.cache, p, path=self.path))
        marks.append(c.mark())
        target = out.logits.argmax(-1)
        host = torch.stack([target, out.batch.tokens]).tolist()  # the engine's sync
        tgt, tok = host
        accepted, emitted = [], []
        for b in range(self.batch):
            kept_b, start = plan.local[b], self.cu[b]
            if self.bench.acceptance.greedy:
                path = walk_greedy(lay, kept_b, start, tgt, tok)
            else:
                rng = step_rng(self.bench.seed, b, self.steps_done)
                path = walk_simulated(lay, plan.q or self.bench.q, kept_b, rng)
            last = kept_b[path[-1]] if path else 0
            accepted.append(last)
            emitted.append([tok[start + kept_b[i]] for i in path] + [tgt[start + last]])
        marks.append(c.mark())
        m.commit(self.cache, out, accepted)
        bonus = [e[-1] for e in emitted]
        self.dstate.pending.copy_(torch.tensor(bonus, dtype=torch.int64))
        self.pending = bonus
        self._record(emitted)
        marks.append(c.mark())
        if mem is not None:
            self._mem_end(mem, base, "verify_peak")
            mem["verify_state_bytes"] = sum(x.numel() * x.element_size() for x in self.verify_state(out)
                                            if x is not None)
        return marks, prep


class SnapshotTreeDecoder(TreeDecoder):
    name = path = "snapshot"
    label, short_label = "snapshot tree", "snapshot"

    @staticmethod
    def verify_state(out) -> list:
        return [out.snapshots]  # [L, B, T+1, HV, V, K] float32


def bole_rows(out) -> list:
    """What a Bole verify keeps for its commit: the replay commit's rows (k, v, g, beta) and
    the verify's factors (one layer's scratch)."""
    return [out.k, out.v, out.g, out.beta, out.u, out.log_p]


class BoleTreeDecoder(TreeDecoder):
    name = path = "bole"
    label = short_label = "Bole"

    @staticmethod
    def verify_state(out) -> list:
        return bole_rows(out)


class ChainDecoder(TreeDecoder):
    """A depth-d top-1 chain (d = bench.chain_depth), drafted and verified whole."""

    chain = True

    @classmethod
    def plan_for(cls, bench, batch):
        return bench.chain_plan(batch, bench.chain_depth)

    @classmethod
    def drafter_for(cls, bench):
        return bench.chain_drafter(bench.chain_depth)

    @classmethod
    def probe(cls, bench, cache, batch, nodes_per_request):
        plan, drafter = cls.plan_for(bench, batch), cls.drafter_for(bench)
        toks = drafter.forward(drafter.new_state(batch, bench.context)).view(-1)
        out = bench.model.verify(cache, plan.forest, toks, path=cls.path)
        out.logits.argmax(-1)
        bench.model.commit(cache, out, [0] * batch)


class ReplaySSMChainDecoder(ChainDecoder):
    """SGLang's ReplaySSM ring. Between materialisations the committed GDN state is the
    pool's checkpoint plus the ring (`model.replayssm.committed_state` reads it)."""

    name, path = "chain", "replayssm"
    label, short_label = "ReplaySSM chain", "RSSM"

    @staticmethod
    def verify_state(out) -> list:
        return list(out.rings.values())  # the ring and its cursors (persistent, per slot)


class BoleChainDecoder(ChainDecoder):
    name, path = "bole-chain", "bole"
    label, short_label = "Bole chain", "Bole ch"

    @staticmethod
    def verify_state(out) -> list:
        return bole_rows(out)


DECODER_CLASSES: dict[str, type[Decoder]] = {c.name: c for c in (
    ARDecoder, SnapshotTreeDecoder, BoleTreeDecoder, ReplaySSMChainDecoder, BoleChainDecoder)}
DECODERS = tuple(DECODER_CLASSES)
BOLE_DECODERS = tuple(name for name, c in DECODER_CLASSES.items() if getattr(c, "path", "") == "bole")
LABELS = {name: c.label for name, c in DECODER_CLASSES.items()}
SHORT_LABELS = {name: c.short_label for name, c in DECODER_CLASSES.items()}


def decoder_class(name: str) -> type[Decoder]:
    try:
        return DECODER_CLASSES[name]
    except KeyError:
        raise InputError(f"decoder {name!r}: expected one of {', '.join(DECODERS)}") from None
