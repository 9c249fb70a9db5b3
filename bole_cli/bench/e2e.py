"""`bole bench e2e`: three decoders over the same requests on the embedded runtime.

Acceptance is SIMULATED; costs are MEASURED. The three decoders:

1. autoregressive ("ar"): one decode step (one token) per request per step;
2. snapshot tree ("snapshot"): the drafted trees verified with SnapshotGDN, node by node
   with a full GDN state snapshot per node, the accepted snapshot copied back (SGLang
   0.5.23's serial verifier where its kernels load, else the PyTorch step loop: the
   output says which);
3. Bole ("bole"): the same trees, verified with the closed form (tree_verify) and
   committed from the factors (tree_commit).

Every step of a tree decoder: the MTP-style drafter (bench/drafter.py) grows an EAGLE
beam tree per request (depth x top-k; its cost is real), the batch budget keeps the N
best nodes of the whole batch (bole_cli.budget.select_budget), the target verifies them
(one hybrid forward), sampling takes the target's argmax at every node and walks the
tree, and the commit makes the accepted path the committed prefix.

The acceptance model (stated in every output): below a node at depth d, the drafter's
rank-r candidate is the target's token with probability q[d][r] (the events exclude each
other); the draft probability of that node IS q[d][r] (a calibrated drafter), so a node
is accepted with probability equal to its path's draft probability. q follows the
calibrate presets (top-1 acceptance a * 0.97^(d-1), rank factor 0.5) with a refitted to
the beam tree this drafter grows, so that budget 128 at depth 8, top-k 4 commits the
paper's mean accepted tokens (paper-mbpp: 6.70 per step, bonus token included). One
`random.Random` per (seed, request, step) draws the walk, so the two tree decoders accept
exactly the same nodes. `--acceptance greedy` instead accepts a draft token iff it equals
the target's argmax at its parent (real tokens): the exactness check, under which all
three decoders emit the same token stream.

Timing: warm-up steps first (they capture the CUDA graphs: drafter, verify, decode),
then `steps` timed steps with CUDA events between the phases (draft | verify | sample |
commit). The only host syncs are the ones a real engine has: sampling (the accepted
lengths come back to the host) and the small host-to-device copies of the next step's
metadata. tokens/s = committed tokens (bonus included) / wall time of the timed steps.
"""

from __future__ import annotations

import functools
import gc
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from bole_cli.bench.drafter import DraftLayout, DraftState, MTPDrafter, build_layout
from bole_cli.budget import BudgetSelection, select_budget
from bole_cli.calibrate import acceptance as acc_mod
from bole_cli.catalog.models import ModelSpec
from bole_cli.errors import BoleError, InputError
from bole_cli.runtime.graphs import try_capture
from bole_cli.runtime.model import HybridCache, HybridModel
from bole_cli.runtime.snapshot import SnapshotGDN, load_sglang_gdn

DECODERS = ("ar", "snapshot", "bole")
LABELS = {"ar": "autoregressive", "snapshot": "snapshot tree", "bole": "Bole"}
PHASES = ("draft", "verify", "sample", "commit")
SNAPSHOT_ENGINES = ("auto", "sglang", "torch")
GREEDY = "greedy"
MiB = 2 ** 20
GiB = 2 ** 30


# ---- the acceptance model ---------------------------------------------------------------

@dataclass(frozen=True)
class Acceptance:
    """Per-depth, per-rank probabilities q[d][r] (draft probability = acceptance
    probability), or greedy acceptance (q then only shapes the tree and the budget).
    Presets keep their depth-1 top-1 acceptance and regenerate q for any depth / top-k."""

    name: str
    source: str
    q: tuple[tuple[float, ...], ...]  # as given (files), or at the paper's depth and top-k
    greedy: bool = False
    top1_depth1: Optional[float] = None

    def rows(self, depth: int, topk: int) -> list[list[float]]:
        """q for `depth` levels of `topk` ranks (ranks a file lacks get 1e-12)."""
        if self.top1_depth1 is not None:
            return _preset_rows(self.top1_depth1, depth, topk)
        if len(self.q) < depth:
            raise InputError(f"--acceptance {self.name}: gives {len(self.q)} depths; --depth {depth} needs {depth}")
        return [list(r[:topk]) + [1e-12] * max(0, topk - len(r)) for r in self.q[:depth]]

    def describe(self, depth: int, topk: int) -> dict[str, Any]:
        return {"name": self.name, "mode": "greedy" if self.greedy else "simulated",
                "source": self.source, "top1_depth1": self.top1_depth1,
                "per_depth_rank": [[round(x, 5) for x in r] for r in self.rows(depth, topk)]}

    def statement(self) -> str:
        if self.greedy:
            return ("acceptance: greedy (a draft token is accepted iff it equals the target's argmax; "
                    "random weights, so few are); costs: measured")
        return f"acceptance: simulated ({self.name}: {self.source}); costs: measured"


def _preset_rows(top1: float, depth: int, topk: int) -> list[list[float]]:
    per_depth = [top1 * acc_mod._DEPTH_DECAY ** d for d in range(depth)]
    return acc_mod.rank_matrix(per_depth, topk, acc_mod.DEFAULT_RANK_FACTOR)


def beam_expected_accepted(rows: Sequence[Sequence[float]], depth: int, topk: int, budget: int,
                           batch: int = 1) -> float:
    """Expected committed tokens per request and step (bonus included) when `batch`
    requests draft the beam tree and share a budget of `budget` nodes."""
    layout = build_layout(depth, topk, rows)
    sel = select_budget([layout.tree] * batch, max(budget, batch))
    return math.fsum(sel.expected_accepted) / batch


@functools.lru_cache(maxsize=None)
def fit_beam_top1(target: float, depth: int = acc_mod.PAPER_DEPTH, topk: int = acc_mod.DEFAULT_TOP_K,
                  budget: int = acc_mod.PAPER_BUDGET) -> float:
    """Depth-1 top-1 acceptance a such that the beam tree (depth, top-k) at `budget`
    commits `target` tokens per step in expectation (batch 1)."""
    lo, hi = 0.05, 0.9999
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if beam_expected_accepted(_preset_rows(mid, depth, topk), depth, topk, budget) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def paper_shape_expected(acc: "Acceptance") -> Optional[float]:
    """Expected committed tokens per step at the paper's shape (depth 8, top-k 4, budget
    128, batch 1) under this acceptance model (None if it has fewer depths)."""
    try:
        rows = acc.rows(acc_mod.PAPER_DEPTH, acc_mod.DEFAULT_TOP_K)
    except InputError:
        return None
    return beam_expected_accepted(rows, acc_mod.PAPER_DEPTH, acc_mod.DEFAULT_TOP_K, acc_mod.PAPER_BUDGET)


def load_e2e_acceptance(spec: str) -> Acceptance:
    """A calibrate preset (refitted to the beam tree), a per-depth acceptance file, or 'greedy'."""
    if spec == GREEDY:
        base = load_e2e_acceptance(acc_mod.DEFAULT_PRESET)
        return Acceptance(GREEDY, f"tree shape and budget from {base.name}", base.q, True, base.top1_depth1)
    if spec in acc_mod.PRESET_TARGETS:
        target = acc_mod.PRESET_TARGETS[spec]
        a1 = fit_beam_top1(target)
        src = (f"top-1 acceptance {a1:.4f} x 0.97^(d-1), rank factor {acc_mod.DEFAULT_RANK_FACTOR}, "
               f"fitted so the drafter's beam tree (depth {acc_mod.PAPER_DEPTH}, top-k {acc_mod.DEFAULT_TOP_K}) "
               f"at budget {acc_mod.PAPER_BUDGET} commits the paper's {target} tokens per step")
        rows = _preset_rows(a1, acc_mod.PAPER_DEPTH, acc_mod.DEFAULT_TOP_K)
        return Acceptance(spec, src, tuple(tuple(r) for r in rows), False, a1)
    model = acc_mod.load_acceptance(spec)  # InputError for an unknown name or a bad file
    if model.q is None:
        raise InputError(f"--acceptance {spec}: bole bench e2e needs per-depth acceptance "
                         "(per_depth or per_depth_rank), not a measured curve")
    for d, r in enumerate(model.q):
        if not r or any(p <= 0 for p in r):
            raise InputError(f"--acceptance {spec}: depth {d + 1} has a probability <= 0")
    return Acceptance(model.name, model.source, tuple(tuple(r) for r in model.q), False)


# ---- trees and the budget -----------------------------------------------------------------

def parse_budget(text: str) -> "str | int":
    t = str(text).strip().lower()
    if t == "profile":
        return "profile"
    try:
        n = int(t)
    except ValueError:
        raise InputError(f"--budget: expected 'profile' or a positive integer, got {text!r}") from None
    if n < 1:
        raise InputError(f"--budget: expected a positive integer, got {n}")
    return n


def resolve_budget(policy: "str | int", spec: ModelSpec, device_name: str, batch: int, context: int,
                   per_request_cap: int) -> tuple[int, str]:
    """(N, where it came from): tree tokens verified per step over the whole batch."""
    if isinstance(policy, int):
        if policy < batch:
            raise InputError(f"--budget {policy} is smaller than batch {batch}: every request "
                             "verifies at least its root")
        n, src = policy, f"--budget {policy}"
    else:
        from bole_cli.catalog.hardware import match_gpu
        from bole_cli.profiles import find_profile, load_profile, lookup_budget

        gpu = match_gpu(device_name)
        path = find_profile(gpu.key, spec) if gpu is not None else None
        if path is None:
            n = acc_mod.PAPER_BUDGET
            src = f"no profile for ({gpu.key if gpu else device_name}, {spec.name}): the paper's {n}"
        else:
            entry, note = lookup_budget(load_profile(path), batch, context)
            n = int(entry["b_ver"])
            src = f"profile {path.parent.name}/{path.name}: B_ver {n} ({note})"
        if n < batch:
            src += f"; raised to {batch} (one node per request)"
            n = batch
    cap = batch * per_request_cap
    if n > cap:
        src += f"; {cap} kept (every drafted node)"
        n = cap
    return n, src


@dataclass
class TreePlan:
    """One batch's budget-selected trees. The tree shape and draft probabilities are the
    acceptance model's, the same every step, so the selection is made once per batch."""

    layout: DraftLayout
    batch: int
    budget: int
    source: str
    selection: BudgetSelection
    local: list[dict[int, int]]  # per request: layout node id -> local index in the kept tree
    kept_index: list[int]  # packed node -> row of the flattened [B, layout nodes] draft
    expected: float  # expected committed tokens per request and step

    @property
    def forest(self):
        return self.selection.forest

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.selection.forest.sizes


def plan_trees(layout: DraftLayout, batch: int, budget: int, source: str = "") -> TreePlan:
    sel = select_budget([layout.tree] * batch, budget)
    local = [{orig: j for j, orig in enumerate(ids)} for ids in sel.kept_ids]
    kept = [b * layout.n_nodes + orig for b, ids in enumerate(sel.kept_ids) for orig in ids]
    return TreePlan(layout, batch, budget, source, sel, local, kept,
                    math.fsum(sel.expected_accepted) / batch)


def walk_simulated(layout: DraftLayout, q: Sequence[Sequence[float]], kept: dict[int, int],
                   rng: random.Random) -> list[int]:
    """Layout ids of the accepted draft nodes (root excluded): below each accepted node one
    uniform draw picks the rank that is the target's token (or none)."""
    node, path = 0, []
    while True:
        d = layout.node_depth[node]
        if d >= len(q):
            return path
        u, acc, rank = rng.random(), 0.0, None
        for r, p in enumerate(q[d][: layout.topk]):
            acc += p
            if u < acc:
                rank = r
                break
        kids = layout.children[node]
        if rank is None or rank >= len(kids) or kids[rank] not in kept:
            return path
        node = kids[rank]
        path.append(node)


def walk_greedy(layout: DraftLayout, kept: dict[int, int], start: int, target: Sequence[int],
                tokens: Sequence[int]) -> list[int]:
    """Layout ids accepted greedily: follow the (first, by rank) kept child whose token is
    the target's argmax at its parent. target/tokens are packed rows; start = cu[b]."""
    node, path = 0, []
    while True:
        want = target[start + kept[node]]
        nxt = next((c for c in layout.children[node] if c in kept and tokens[start + kept[c]] == want), None)
        if nxt is None:
            return path
        node = nxt
        path.append(node)


def step_rng(seed: int, request: int, step: int) -> random.Random:
    return random.Random(f"bole-e2e/{seed}/{request}/{step}")


# ---- plumbing: clock, graphs ----------------------------------------------------------------

class _Clock:
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


class _Graphs:
    """One CUDA graph per (step kind, metadata signature), as GraphedRunner does: the first
    call warms up and captures, later calls copy new metadata into the static inputs and
    replay. `save` returns a restore callable for steps whose warm-up mutates state."""

    def __init__(self, enabled: bool, warmup: int = 2):
        self.enabled = enabled
        self.reason = "" if enabled else "CUDA graphs off (CPU or --no-graphs)"
        self.warmup = warmup
        self._steps: dict[tuple, tuple[Any, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if enabled else None

    def run(self, key: tuple, prepared, fn: Callable[[Any], Any], save: Optional[Callable[[], Callable]] = None):
        if not self.enabled:
            return fn(prepared)
        entry = self._steps.get(key)
        if entry is None:
            restore = save() if save is not None else None
            step, why = try_capture(lambda: fn(prepared), warmup=self.warmup, pool=self._pool)
            if restore is not None:
                restore()
            if step is None:
                self.enabled, self.reason = False, why
                return fn(prepared)
            entry = self._steps[key] = (step, prepared)
        elif prepared is not None and prepared is not entry[1]:
            entry[1].copy_from(prepared)
        return entry[0].replay()

    def clear(self) -> None:
        self._steps.clear()


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "alloc_failed" in text)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# ---- decoders ----------------------------------------------------------------------------------

class _Decoder:
    """Shared state of one decoder over one batch: cache, pending tokens, streams."""

    name = ""

    def __init__(self, bench: "E2EBench", batch: int, max_steps: int):
        self.bench, self.model = bench, bench.model
        self.batch = batch
        self.slots = list(range(batch))
        self.max_len = bench.max_len(max_steps)
        self.cache = bench.new_cache(batch, self.max_len)
        self.pending = bench.initial_tokens(batch)  # host list: each request's last token
        self.streams: list[list[int]] = [[] for _ in range(batch)]
        self.accepted: list[list[int]] = []  # per step: committed tokens per request
        self.graphs = _Graphs(bench.use_graphs)
        self.clock = _Clock(bench.device.type == "cuda")
        self.steps_done = 0

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


class ARDecoder(_Decoder):
    name = "ar"

    def __init__(self, bench, batch, max_steps):
        super().__init__(bench, batch, max_steps)
        self.pending_dev = torch.tensor(self.pending, dtype=torch.int64, device=bench.device)

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


class TreeDecoder(_Decoder):
    """Draft, budget-selected verify (path "snapshot" or "bole"), sample, commit."""

    def __init__(self, bench, batch, max_steps, path: str, plan: TreePlan,
                 override: Optional[Callable[["TreeDecoder", torch.Tensor], torch.Tensor]] = None):
        super().__init__(bench, batch, max_steps)
        self.name = path
        self.path = path
        self.plan = plan
        self.drafter = bench.drafter
        self.dstate: DraftState = self.drafter.new_state(batch, bench.context, seed=bench.seed + 11)
        self.dstate.pending.copy_(torch.tensor(self.pending, dtype=torch.int64))
        self.kept_index = torch.tensor(plan.kept_index, dtype=torch.int64, device=bench.device)
        self.override = override  # tests: replace the drafted tokens (an oracle drafter)
        self.cu = list(plan.forest.cu_seqlens)

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
                path = walk_simulated(lay, self.bench.q, kept_b, rng)
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
            t = [out.snapshots] if self.path == "snapshot" else [out.k, out.u, out.log_p]
            mem["verify_state_bytes"] = sum(x.numel() * x.element_size() for x in t if x is not None)
        return marks, prep


# ---- the bench -------------------------------------------------------------------------------

@dataclass
class RunResult:
    decoder: str
    batch: int
    steps: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    tok_s: Optional[float] = None
    speedup_vs_ar: Optional[float] = None
    mean_accepted: Optional[float] = None  # committed tokens per request and step (bonus incl.)
    expected_accepted: Optional[float] = None  # the acceptance model's expectation
    phase_ms: dict = field(default_factory=dict)  # per step: draft, verify, sample, commit
    step_ms: Optional[float] = None  # wall per step
    verify_prep_ms: Optional[float] = None  # host metadata preparation inside "verify"
    peak_transient_bytes: Optional[int] = None  # measured: one eager step, max over phases
    verify_peak_bytes: Optional[int] = None  # measured: verify + sample + commit
    verify_state_bytes: Optional[int] = None  # snapshot buffer, or Bole's factors (k, u, log_p)
    budget: Optional[int] = None
    budget_source: str = ""
    nodes_per_request: Optional[list[int]] = None
    cuda_graphs: bool = False
    eager_reason: str = ""
    accept_trace: Optional[list[list[int]]] = None  # committed tokens per step and request
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def search_max_batch(fits: Callable[[int], tuple[bool, str]], max_batch: int, max_probes: int) -> dict:
    """Largest batch for which fits(batch) holds, probing at most max_probes batches:
    max_batch first, then bisection (geometric while the range spans more than 2x)."""
    probes = []

    def probe(b):
        ok, why = fits(b)
        probes.append({"batch": b, "fits": ok, "why": why})
        return ok, why

    ok, why = probe(max_batch)
    if ok:
        return {"max_batch": max_batch, "capped": True, "exact": False, "fails_at": None, "probes": probes}
    if why and why != "out of memory":
        return {"max_batch": None, "capped": False, "exact": False, "fails_at": None, "probes": probes,
                "error": why}
    lo, hi = 0, max_batch
    while hi - lo > 1 and len(probes) < max_probes:
        base = max(lo, 1)
        mid = int(round(math.sqrt(base * hi))) if hi > 2 * base else (lo + hi) // 2
        mid = min(max(mid, lo + 1), hi - 1)
        ok, why = probe(mid)
        if ok:
            lo = mid
        elif why and why != "out of memory":
            return {"max_batch": lo or None, "capped": False, "exact": False, "fails_at": mid,
                    "probes": probes, "error": why}
        else:
            hi = mid
    return {"max_batch": lo, "capped": False, "exact": hi - lo == 1, "fails_at": hi, "probes": probes}


def resolve_snapshot_engine(choice: str, device: torch.device) -> tuple[SnapshotGDN, str]:
    if choice not in SNAPSHOT_ENGINES:
        raise InputError(f"--snapshot-engine: expected one of {', '.join(SNAPSHOT_ENGINES)}, got {choice!r}")
    torch_desc = ("PyTorch step loop (a faithful equivalent of SGLang's serial verify: node by node, "
                  "a full float32 state snapshot per node, the accepted one copied back)")
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        why = "" if choice == "torch" else "; SGLang's kernels are used on CUDA only"
        return SnapshotGDN(), torch_desc + why
    try:
        kernels = load_sglang_gdn()
        engine = SnapshotGDN(kernels)
    except Exception as exc:  # noqa: BLE001 - no wheel / no loader: fall back, and say so
        if choice == "sglang":
            raise BoleError(f"--snapshot-engine sglang: SGLang's kernels did not load: {exc}") from exc
        return SnapshotGDN(), f"{torch_desc}; SGLang 0.5.23's kernels did not load ({exc})"
    src = getattr(getattr(kernels, "source", None), "describe", lambda: "")()
    ver = getattr(kernels, "version", None) or "0.5.23"
    return engine, (f"SGLang {ver}'s fused_sigmoid_gating_delta_rule_update (its serial tree verify, writing "
                    "a float32 snapshot per node), then the accepted snapshots copied back (one gather over "
                    "all layers)" + (f"; kernels from {src}" if src else ""))


class E2EBench:
    """The model, the drafter, the acceptance model and the three decoders."""

    def __init__(self, spec: ModelSpec, *, device="cuda", dtype=torch.bfloat16, context: int = 4096,
                 depth: int = 8, topk: int = 4, acceptance: "Acceptance | str" = acc_mod.DEFAULT_PRESET,
                 budget: "str | int" = "profile", seed: int = 0, snapshot_engine: str = "auto",
                 use_graphs: Optional[bool] = None, gdn_backend: str = "auto", warmup: int = 3,
                 steps: int = 32):
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.context = int(context)
        if self.context < 1:
            raise InputError(f"--context must be at least 1, got {context}")
        self.seed = seed
        self.warmup, self.steps = int(warmup), int(steps)
        if self.steps < 1 or self.warmup < 0:
            raise InputError("--steps must be >= 1 and --warmup >= 0")
        self.acceptance = (acceptance if isinstance(acceptance, Acceptance)
                           else load_e2e_acceptance(acceptance))
        self.q = self.acceptance.rows(depth, topk)
        self.layout = build_layout(depth, topk, self.q)
        self.budget_policy = budget
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else bool(use_graphs)
        self._check_weights_fit()
        self.model = HybridModel(spec, self.device, dtype, seed=seed, gdn_backend=gdn_backend)
        self.drafter = MTPDrafter(self.model, self.layout, seed=seed + 4321)
        self.snapshot, self.snapshot_desc = resolve_snapshot_engine(snapshot_engine, self.device)
        self.model.snapshot = self.snapshot
        self._plans: dict[tuple[int, int], TreePlan] = {}

    # ---- sizes -------------------------------------------------------------------------
    def _check_weights_fit(self) -> None:
        if self.device.type != "cuda":
            return
        from bole_cli.runtime.model import param_bytes

        need = param_bytes(self.spec, self.dtype) + MTPDrafter.param_bytes_for(self.spec, self.dtype)
        free = torch.cuda.mem_get_info(self.device)[0]
        if need + GiB > free:
            raise BoleError(f"{self.spec.name}: the weights ({need / GiB:.1f} GiB with the draft head) do not "
                            f"fit in the {free / GiB:.1f} GiB free on {self.device_name}")

    def max_len(self, max_steps: int) -> int:
        """Cache positions per request: the context, every step's growth, one tree, slack.
        It is also the KV read length of every step (one graph bucket), for all decoders."""
        grow = (max_steps + 1) * (self.layout.depth + 1)
        n = self.context + grow + self.layout.n_nodes + 1
        return -(-n // 64) * 64

    def new_cache(self, batch: int, max_len: int, *, fill: bool = True) -> HybridCache:
        """Slots holding a committed context of random contents: the same for every decoder
        whatever max_len (positions past the context stay zero: they are never read unmasked)."""
        cache = self.model.new_cache(batch, max_len)
        if fill:
            gen = torch.Generator(device=self.device).manual_seed(self.seed + 1)
            cache.gdn_state.copy_(torch.randn(cache.gdn_state.shape, generator=gen, device=self.device,
                                              dtype=cache.gdn_state.dtype).mul_(0.05))
            cache.conv_state.copy_(torch.randn(cache.conv_state.shape, generator=gen, device=self.device,
                                               dtype=cache.conv_state.dtype))
            for kv in (cache.k_cache, cache.v_cache):
                for layer in kv:  # one layer at a time: a small temporary
                    part = layer[:, :, : self.context]
                    part.copy_(torch.randn(part.shape, generator=gen, device=self.device, dtype=part.dtype))
        for s in range(batch):
            cache.kv_lens[s] = self.context
        return cache

    def initial_tokens(self, batch: int) -> list[int]:
        rng = random.Random(f"bole-e2e/{self.seed}/prompt")
        return [rng.randrange(self.spec.vocab) for _ in range(batch)]

    def plan(self, batch: int, budget: Optional[int] = None, source: str = "") -> TreePlan:
        if budget is None:
            budget, source = resolve_budget(self.budget_policy, self.spec, self.device_name, batch,
                                            self.context, self.layout.n_nodes)
        key = (batch, budget)
        if key not in self._plans:
            self._plans[key] = plan_trees(self.layout, batch, budget, source)
        return self._plans[key]

    def decoder(self, name: str, batch: int, max_steps: int, *, override=None) -> _Decoder:
        if name == "ar":
            return ARDecoder(self, batch, max_steps)
        if name not in ("snapshot", "bole"):
            raise InputError(f"decoder {name!r}: expected one of {', '.join(DECODERS)}")
        return TreeDecoder(self, batch, max_steps, name, self.plan(batch), override=override)

    # ---- one (decoder, batch) ------------------------------------------------------------
    @torch.inference_mode()
    def run(self, name: str, batch: int) -> RunResult:
        res = RunResult(name, batch)
        if name != "ar":
            plan = self.plan(batch)
            res.budget, res.budget_source = plan.budget, plan.source
            res.nodes_per_request = list(plan.sizes)
            res.expected_accepted = plan.expected
        else:
            res.expected_accepted = 1.0
        dec = None
        try:
            dec = self.decoder(name, batch, self.warmup + self.steps + 1)
            for _ in range(self.warmup):
                dec.step()
            _sync(self.device)
            all_marks, preps = [], []
            t0 = time.perf_counter()
            for _ in range(self.steps):
                marks, prep = dec.step()
                all_marks.append(marks)
                preps.append(prep)
            _sync(self.device)
            res.wall_s = time.perf_counter() - t0
            timed = dec.accepted[self.warmup:]
            res.steps = self.steps
            res.tokens = sum(map(sum, timed))
            res.tok_s = res.tokens / res.wall_s
            res.mean_accepted = res.tokens / (self.steps * batch)
            res.step_ms = 1e3 * res.wall_s / self.steps
            res.phase_ms = {ph: 1e3 * sum(dec.clock.seconds(mk[i], mk[i + 1]) for mk in all_marks) / self.steps
                            for i, ph in enumerate(PHASES)}
            res.verify_prep_ms = 1e3 * sum(preps) / self.steps
            res.cuda_graphs, res.eager_reason = dec.graphs.enabled, dec.graphs.reason
            dec.graphs.clear()
            _free(self.device)
            mem: dict = {}
            dec.step(eager=True, mem=mem)  # one more step, eager, for the memory peaks
            if self.device.type == "cuda":
                res.verify_peak_bytes = mem.get("verify_peak")
                res.peak_transient_bytes = max(mem.get("draft_peak", 0), mem.get("verify_peak", 0))
            res.verify_state_bytes = mem.get("verify_state_bytes")
            res.accept_trace = dec.accepted
        except Exception as exc:  # noqa: BLE001 - keep the other decoders' results; the error is reported
            res.error = "out of memory" if _is_oom(exc) else f"{type(exc).__name__}: {exc}"
            res.tok_s = None
        finally:
            dec = None
            _free(self.device)
        return res

    # ---- the largest batch ---------------------------------------------------------------
    @torch.inference_mode()
    def fits(self, name: str, batch: int, nodes_per_request: int) -> tuple[bool, str]:
        """One eager step of `name` at `batch` with the KV cache at the context (tree
        decoders: `nodes_per_request` tree tokens per request); False on an allocation failure."""
        ok, why = True, ""
        cache = st = out = logits = None
        try:
            cache = self.new_cache(batch, self.context + nodes_per_request + 2, fill=False)
            if name == "ar":
                logits = self.model.decode(cache, torch.zeros(batch, dtype=torch.int64, device=self.device))
                logits.argmax(-1)
            else:
                plan = plan_trees(self.layout, batch, nodes_per_request * batch)
                st = self.drafter.new_state(batch, self.context)
                toks = self.drafter.forward(st).view(-1)
                kept = toks.index_select(0, torch.tensor(plan.kept_index, device=self.device))
                out = self.model.verify(cache, plan.forest, kept, path=name)
                out.logits.argmax(-1)
                self.model.commit(cache, out, [0] * batch)
            _sync(self.device)
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                ok, why = False, f"{type(exc).__name__}: {exc}"
            else:
                ok, why = False, "out of memory"
        finally:
            cache = st = out = logits = None
            _free(self.device)
        return ok, why

    def max_batch(self, name: str, *, max_batch: int, max_probes: int, nodes_per_request: int,
                  progress: Callable[[str], None] = lambda _: None) -> dict:
        if self.device.type != "cuda":
            return {"max_batch": None, "skipped": "needs CUDA (allocation failures on CPU mean host RAM)"}

        def fits(b):
            progress(f"largest batch, {LABELS[name]}: trying {b}")
            return self.fits(name, b, nodes_per_request)

        found = search_max_batch(fits, max_batch, max_probes)
        found["nodes_per_request"] = 0 if name == "ar" else nodes_per_request
        return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the whole command -----------------------------------------------------------------------

@dataclass
class E2EConfig:
    spec: ModelSpec
    batches: list[int]
    context: int = 4096
    budget: "str | int" = "profile"
    acceptance: str = acc_mod.DEFAULT_PRESET
    depth: int = 8
    topk: int = 4
    steps: int = 32
    warmup: int = 3
    seed: int = 0
    decoders: tuple[str, ...] = DECODERS
    device: str = "cuda"
    dtype: str = "bfloat16"
    snapshot_engine: str = "auto"
    use_graphs: Optional[bool] = None
    max_batch: int = 256
    max_probes: int = 8
    probe_nodes: Optional[int] = None
    search: bool = True
    command: str = ""


def versions() -> dict[str, Optional[str]]:
    from bole_cli import __version__

    try:
        import triton

        tv = triton.__version__
    except Exception:  # noqa: BLE001
        tv = None
    return {"bole": __version__, "torch": torch.__version__, "triton": tv,
            "cuda": torch.version.cuda}


def run_e2e(cfg: E2EConfig, progress: Callable[[str], None] = lambda _: None) -> dict:
    started = time.time()
    dtype = getattr(torch, cfg.dtype)
    bad = [d for d in cfg.decoders if d not in DECODERS]
    if bad or not cfg.decoders:
        raise InputError(f"--decoders: expected some of {', '.join(DECODERS)}, got {','.join(cfg.decoders)!r}")
    progress("building the model")
    bench = E2EBench(cfg.spec, device=cfg.device, dtype=dtype, context=cfg.context, depth=cfg.depth,
                     topk=cfg.topk, acceptance=cfg.acceptance, budget=cfg.budget, seed=cfg.seed,
                     snapshot_engine=cfg.snapshot_engine, use_graphs=cfg.use_graphs,
                     warmup=cfg.warmup, steps=cfg.steps)
    for b in cfg.batches:  # budget errors before any timing
        if any(d != "ar" for d in cfg.decoders):
            bench.plan(b)
    results: list[RunResult] = []
    for b in cfg.batches:
        for name in cfg.decoders:
            progress(f"{LABELS[name]}, batch {b}")
            results.append(bench.run(name, b))
    ar = {r.batch: r.tok_s for r in results if r.decoder == "ar" and r.tok_s}
    for r in results:
        if r.tok_s and ar.get(r.batch):
            r.speedup_vs_ar = r.tok_s / ar[r.batch]
    same = {}
    for b in cfg.batches:
        traces = [r.accept_trace for r in results if r.batch == b and r.decoder in ("snapshot", "bole")
                  and r.accept_trace is not None]
        if len(traces) == 2:
            same[str(b)] = traces[0] == traces[1]

    nodes = cfg.probe_nodes
    if nodes is None:
        nodes = max(bench.plan(min(cfg.batches)).sizes)
    nodes = max(1, min(int(nodes), bench.layout.n_nodes))
    max_batch: dict[str, Any] = {}
    if cfg.search:
        for name in cfg.decoders:
            max_batch[name] = bench.max_batch(name, max_batch=cfg.max_batch, max_probes=cfg.max_probes,
                                              nodes_per_request=nodes, progress=progress)
    acc = bench.acceptance
    data = {
        "benchmark": "bole bench e2e",
        "statement": acc.statement(),
        "acceptance": acc.describe(cfg.depth, cfg.topk),
        "costs": "measured (CUDA events per phase, wall clock for tokens/s)" if bench.device.type == "cuda"
                 else "measured on CPU (smoke run: the numbers mean nothing for a GPU)",
        "device": bench.device_name,
        "versions": {**versions(), "sglang": getattr(bench.snapshot.kernels, "version", None)},
        "command": cfg.command,
        "model": cfg.spec.name,
        "dtype": cfg.dtype,
        "context": cfg.context,
        "draft": {"depth": cfg.depth, "topk": cfg.topk, "beam_nodes": bench.layout.n_nodes,
                  "head": "MTP-style: fc + one gated-attention decoder layer + the shared LM head, "
                          "run once per level (its cost is real; its tree shape follows the acceptance model)",
                  "head_bytes": bench.drafter.param_bytes},
        "budget_policy": cfg.budget,
        "expected_accepted_paper_shape": None if acc.greedy else paper_shape_expected(acc),
        "snapshot_engine": {"engine": bench.snapshot.engine, "description": bench.snapshot_desc},
        "gdn_ops": bench.model.ops.describe(),
        "ar_gdn_decode": bench.model.gdn_decode,
        "kv_read": "every step reads the cache's full capacity (context + the run's growth), masked: one "
                   "graph bucket, the same for all decoders",
        "steps": cfg.steps, "warmup": cfg.warmup, "seed": cfg.seed,
        "results": [r.to_dict() for r in results],
        "same_acceptance_snapshot_vs_bole": same,
        "max_batch": max_batch,
        "max_batch_probe": {"nodes_per_request": nodes, "context": cfg.context, "limit": cfg.max_batch,
                            "max_probes": cfg.max_probes,
                            "how": "one eager step per probe (drafter, verify, sample, commit) with the KV cache "
                                   "at the context; fails = a CUDA allocation failure"},
        "weights_bytes": bench.model.param_bytes,
        "seconds": time.time() - started,
    }
    for r in data["results"]:
        r.pop("accept_trace", None)
    bench = None
    _free(torch.device(cfg.device))
    return data


# ---- output ------------------------------------------------------------------------------------

def _fmt_bytes(n: Optional[int]) -> str:
    from bole_cli.memory import format_bytes

    return "-" if n is None else format_bytes(n)


def _fmt_max(entry: Optional[dict]) -> str:
    if not entry or entry.get("max_batch") is None:
        return "-" if not entry or "error" not in entry else "error"
    m = entry["max_batch"]
    if entry.get("capped"):
        return f">= {m}"
    return str(m) if entry.get("exact") else f"{m} (< {entry['fails_at']})"


SHORT_LABELS = {"ar": "AR", "snapshot": "snapshot", "bole": "Bole"}
WIDE_COLUMNS = 150  # the one-table layout needs about this many terminal columns

_CAPTION = ("acc. = committed tokens per request and step (bonus included), exp. = the acceptance "
            "model's expectation, N = tree tokens verified per step (whole batch), peak = transient "
            "memory of one step (measured), state = snapshot buffer or Bole's factors, max B = largest "
            "batch that fits")
_THROUGHPUT = ("tok/s", "vs AR", "acc.", "exp.", "N")
_COSTS = ("draft", "verify", "sample", "commit", "step", "peak", "state")


def _cells(data: dict, r: dict) -> dict:
    """One result row as {column: text}."""
    mb = _fmt_max(data["max_batch"].get(r["decoder"]))
    if r["error"]:
        blank = {c: "-" for c in _THROUGHPUT + _COSTS}
        return {**blank, "tok/s": "OOM" if r["error"] == "out of memory" else "error", "max B": mb}
    ph = r["phase_ms"]
    return {"tok/s": f"{r['tok_s']:.0f}",
            "vs AR": f"{r['speedup_vs_ar']:.2f}x" if r["speedup_vs_ar"] else "-",
            "acc.": f"{r['mean_accepted']:.2f}", "exp.": f"{r['expected_accepted']:.2f}",
            "N": str(r["budget"]) if r["budget"] else "-",
            **{p: f"{ph[p]:.2f}" for p in PHASES}, "step": f"{r['step_ms']:.2f}",
            "peak": _fmt_bytes(r["peak_transient_bytes"]), "state": _fmt_bytes(r["verify_state_bytes"]),
            "max B": mb}


def _one_table(data: dict, title: str, cols: tuple, caption: Optional[str], labels: dict, narrow=False):
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", caption=caption, box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
              pad_edge=not narrow)
    for c in ("decoder", "B" if narrow else "batch") + cols:
        t.add_column(c, justify="left" if c == "decoder" else "right", no_wrap=True)
    for r in data["results"]:
        cells = _cells(data, r)
        t.add_row(labels[r["decoder"]], str(r["batch"]), *(cells[c] for c in cols))
    return t


def tables(data: dict, width: int = WIDE_COLUMNS) -> list:
    """decoder x batch: tokens/s, speedup over AR, accepted tokens (measured, expected),
    budget, per-step split (ms), peak transient memory, verify state buffers, max batch. One
    table when the terminal is wide enough, else throughput and costs as two."""
    title = (f"bole bench e2e: {data['model']} on {data['device']}, context {data['context']}, "
             f"depth {data['draft']['depth']}, top-k {data['draft']['topk']}\n{data['statement']}")
    if width >= WIDE_COLUMNS:
        return [_one_table(data, title + " (times: ms per step)", _THROUGHPUT + _COSTS + ("max B",), _CAPTION,
                           LABELS)]
    return [_one_table(data, title, _THROUGHPUT + ("max B",), None, LABELS, narrow=True),
            _one_table(data, "per step: ms, and memory", _COSTS, _CAPTION, SHORT_LABELS, narrow=True)]


def notes(data: dict) -> list[str]:
    out = [f"snapshot tree verify: {data['snapshot_engine']['description']}"]
    budgets = {}
    for r in data["results"]:
        if r["budget_source"]:
            budgets[r["batch"]] = r["budget_source"]
    for b, src in budgets.items():
        out.append(f"budget at batch {b}: {src}")
    mb = data["max_batch_probe"]
    if data["max_batch"]:
        out.append(f"max batch: binary search up to {mb['limit']} ({mb['max_probes']} probes at most), context "
                   f"{mb['context']}, tree decoders verifying {mb['nodes_per_request']} nodes per request")
    for r in data["results"]:
        if r["error"]:
            out.append(f"{LABELS[r['decoder']]} at batch {r['batch']} failed: {r['error']}")
    for name, mb in data["max_batch"].items():
        if mb.get("error"):
            out.append(f"largest-batch search of {LABELS[name]} stopped: {mb['error']}")
    for b, same in data["same_acceptance_snapshot_vs_bole"].items():
        if not same:
            out.append(f"WARNING: the two tree decoders accepted different nodes at batch {b}")
    return out


def plot(data: dict, path) -> None:
    """Throughput against batch size (left) and speedup over autoregressive (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bole_cli.console import save_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    batches = sorted({r["batch"] for r in data["results"]})
    for name in DECODERS:
        rows = [r for r in data["results"] if r["decoder"] == name and r["tok_s"]]
        if not rows:
            continue
        label = LABELS[name]
        mb = data["max_batch"].get(name)
        if mb and mb.get("max_batch") is not None:
            label += f" (max batch {_fmt_max(mb)})"
        line, = ax.plot([r["batch"] for r in rows], [r["tok_s"] for r in rows], "o-", label=label)
        sp = [r for r in rows if r["speedup_vs_ar"]]
        if sp and name != "ar":
            bx.plot([r["batch"] for r in sp], [r["speedup_vs_ar"] for r in sp], "o-", color=line.get_color(),
                    label=LABELS[name])
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(batches, [str(b) for b in batches])
        a.set_xlabel("batch size")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s")
    bx.axhline(1.0, color="grey", lw=0.8, ls="--")
    bx.set_ylabel("speedup over autoregressive")
    ax.legend(fontsize=8)
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=8)
    mode = "acceptance simulated" if data["acceptance"]["mode"] == "simulated" else "greedy acceptance"
    fig.suptitle(f"{data['model']} on {data['device']}, context {data['context']}, depth {data['draft']['depth']}, "
                 f"top-k {data['draft']['topk']} ({mode} [{data['acceptance']['name']}], costs measured)", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)
