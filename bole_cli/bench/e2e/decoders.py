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
from bole_cli.bench.e2e.device_walk import DeviceWalk, simulated_ranks
from bole_cli.bench.e2e.tree_budget import TreePlan, plan_trees
from bole_cli.errors import InputError
from bole_cli.runtime.graphs import GraphCache
from bole_cli.runtime.model import HybridCache
from bole_cli.runtime.tree_metadata import refill_decode, refill_tree

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

    @classmethod
    def verifies_tree(cls) -> bool:
        """Drafts a tree verified under the batch budget (its shape and budget swept)."""
        return cls.drafts and not cls.chain

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
        dev = bench.device
        self.tokens_in = torch.tensor(self.pending, dtype=torch.int64, device=dev)
        self.base = torch.tensor([self.cache.kv_lens[s] for s in self.slots], dtype=torch.int64, device=dev)
        # the bucket, prepared once: every step refills it on the device (tree_metadata)
        self.db = self.model.prepare_decode(self.cache, self.pending, self.slots, kv_bucket=self.max_len)

    @classmethod
    def probe(cls, bench, cache, batch, nodes_per_request):
        logits = bench.model.decode(cache, torch.zeros(batch, dtype=torch.int64, device=bench.device))
        logits.argmax(-1)

    def _decode(self) -> torch.Tensor:
        """Metadata, forward, greedy sample, the next step's inputs: device only."""
        m, db = self.model, self.db
        refill_decode(db, self.tokens_in, self.base, m.rope)
        nxt = m.forward_decode(self.cache, db).argmax(-1)
        self.tokens_in.copy_(nxt)
        self.base.add_(1)
        return nxt

    def step(self, *, eager=False, mem=None):
        c = self.clock
        marks = [c.mark()]
        marks.append(c.mark())  # no draft
        base = self._mem_start(mem)
        nxt = self._decode() if eager else self.graphs.run(("decode",), self._decode)
        marks.append(c.mark())
        host = nxt.tolist()  # the step's one sync: the sampled tokens come back
        t0 = time.perf_counter()
        marks.append(c.mark())
        for s in self.slots:
            self.cache.kv_lens[s] += 1
        self.pending = host
        self._record([[t] for t in host])
        marks.append(c.mark())
        self._mem_end(mem, base, "verify_peak")
        return marks, time.perf_counter() - t0


class TreeDecoder(Decoder):
    """Draft, budget-selected verify (HybridModel.forward_verify's `path`), sample, commit,
    each phase one device-only step (a CUDA graph after the first): the tree's metadata is
    refilled on the device from the drafted tokens and the committed lengths, the accepted
    path is found on the device (device_walk.py), and the step's one host sync hands back
    the committed tokens (docs/design.md §8)."""

    path = ""
    drafts = True

    def __init__(self, bench, batch, max_steps, plan: TreePlan,
                 override: Optional[Callable[["TreeDecoder", torch.Tensor], torch.Tensor]] = None):
        super().__init__(bench, batch, max_steps)
        dev = bench.device
        self.plan = plan
        self.max_steps = max_steps
        self.drafter = self.drafter_for(bench)
        self.dstate: DraftState = self.drafter.new_state(batch, bench.context, seed=bench.seed + 11)
        self.dstate.pending.copy_(torch.tensor(self.pending, dtype=torch.int64))
        self.kept_index = torch.tensor(plan.kept_index, dtype=torch.int64, device=dev)
        self.override = override  # tests: replace the drafted tokens (an oracle drafter)
        forest = plan.forest
        self.parents_in = torch.tensor(list(forest.parents), dtype=torch.int32, device=dev)
        self.tokens_in = torch.zeros(forest.n_nodes, dtype=torch.int64, device=dev)
        self.base = torch.tensor([self.cache.kv_lens[s] for s in self.slots], dtype=torch.int64, device=dev)
        self.tb = self.model.prepare_verify(self.cache, forest, self.tokens_in.cpu(), self.slots,
                                            kv_bucket=self.max_len)
        acc = bench.acceptance
        ranks = None if acc.greedy else simulated_ranks(plan.q or bench.q, plan.layout.topk, plan.layout.depth,
                                                         bench.seed, batch, max_steps)
        self.walk = DeviceWalk(plan, dev, greedy=acc.greedy, ranks=ranks)  # raises if a root is not kept

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

    # ---- the phases: device only, each a graph after its first step ----------------------
    def _draft(self) -> torch.Tensor:
        toks = self.drafter.forward(self.dstate)
        torch.index_select(toks.view(-1), 0, self.kept_index, out=self.tokens_in)
        return toks

    def _verify(self):
        m = self.model
        refill_tree(self.tb, self.parents_in, self.tokens_in, self.base, m.rope)
        return m.forward_verify(self.cache, self.tb, path=self.path)

    def _sample(self, out):
        return self.walk.sample(out.logits.argmax(-1), out.batch.tokens)

    def _commit(self, out, accepted, emitted) -> None:
        self.model.commit_device(self.cache, out, accepted)
        count = emitted[:, 0]
        self.base.add_(count)  # the committed lengths: root + accepted drafts
        self.dstate.pending.copy_(emitted.gather(1, count[:, None])[:, 0])  # the bonus: next root
        self.walk.advance()

    def step(self, *, eager=False, mem=None):
        if not self.walk.greedy and self.steps_done >= self.walk.steps:
            raise RuntimeError(f"{self.name}: step {self.steps_done + 1} of a decoder built for {self.walk.steps}")
        c = self.clock
        run = (lambda key, fn: fn()) if eager else self.graphs.run
        marks = [c.mark()]
        base = self._mem_start(mem)
        toks = run(("draft",), self._draft)
        if self.override is not None:
            toks = self.override(self, toks.clone())
            torch.index_select(toks.view(-1), 0, self.kept_index, out=self.tokens_in)
        self._mem_end(mem, base, "draft_peak")
        marks.append(c.mark())
        base = self._mem_start(mem)
        out = run(("verify", self.path), self._verify)
        marks.append(c.mark())
        accepted, emitted = run(("sample",), lambda: self._sample(out))
        marks.append(c.mark())
        run(("commit",), lambda: self._commit(out, accepted, emitted))
        marks.append(c.mark())
        host = emitted.tolist()  # the step's one sync: the committed tokens come back
        t0 = time.perf_counter()
        rows = []
        for b, s in enumerate(self.slots):
            n = host[b][0]
            rows.append(host[b][1:n + 1])
            self.cache.kv_lens[s] += n
        self.pending = [r[-1] for r in rows]
        self._record(rows)
        host_s = time.perf_counter() - t0
        if mem is not None:
            self._mem_end(mem, base, "verify_peak")
            mem["verify_state_bytes"] = sum(x.numel() * x.element_size() for x in self.verify_state(out)
                                            if x is not None)
        return marks, host_s


class SnapshotTreeDecoder(TreeDecoder):
    name = path = "snapshot"
    label, short_label = "snapshot tree", "snapshot"

    @staticmethod
    def verify_state(out) -> list:
        return [out.snapshots]  # [L, B, T+1, HV, V, K] float32


def bole_rows(out) -> list:
    """What a Bole verify keeps for its commit beyond the in_proj outputs every path keeps
    (whose b and a columns are the replay commit's raw gates): k and v inside every layer's
    conv outputs, whose q columns are held with them, and the verify's factors (one layer's
    scratch)."""
    return [out.conv_out, out.u, out.log_p]


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
