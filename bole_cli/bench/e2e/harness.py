"""`bole bench e2e`'s runner: E2EBench, what the decoders (decoders.py) of one run share.

Acceptance is SIMULATED (simulated_acceptance.py); costs are MEASURED. E2EBench holds the
model (random weights at the model's real shapes), the drafter, the acceptance model and
the budget plans (tree_budget.py); it times one (decoder, batch) (`run`) and probes the
largest batch a decoder fits (`max_batch`, CUDA only). sweep.py runs it over a checked
config (options.py).

Timing: warm-up steps first (the first runs eagerly, the second captures each phase's
CUDA graph: draft, verify, sample, commit; decode), then `steps` timed steps with CUDA
events between the phases (draft | verify | sample | commit). A step is device-only
(decoders.py): its one host sync hands back the committed tokens, as a serving engine's
does. tokens/s = committed tokens (bonus included) / wall time of the timed steps.
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from bole_cli.bench.drafter import MTPDrafter, build_layout
from bole_cli.bench.e2e.simulated_acceptance import Acceptance, load_e2e_acceptance
from bole_cli.bench.e2e.decoders import LABELS, PHASES, Decoder, decoder_class
from bole_cli.bench.e2e.options import BUDGET, DEVICE, E2E_DEFAULTS as FULL, SEED, SNAPSHOT_ENGINE, SNAPSHOT_ENGINES
from bole_cli.bench.e2e.tree_budget import TreePlan, plan_trees, resolve_budget
from bole_cli.calibrate.acceptance import DEFAULT_PRESET
from bole_cli.catalog.models import ModelSpec
from bole_cli.errors import BoleError, InputError
from bole_cli.runtime.model import HybridCache, HybridModel
from bole_cli.memory import GiB
from bole_cli.versions import SGLANG_VERSION
from bole_cli.runtime.snapshot import SnapshotGDN, load_sglang_gdn


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "alloc_failed" in text)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    host_ms: Optional[float] = None  # per step: host work after the step's one sync (bookkeeping)
    peak_transient_bytes: Optional[int] = None  # measured: one eager step, max over phases
    verify_peak_bytes: Optional[int] = None  # measured: verify + sample + commit
    verify_state_bytes: Optional[int] = None  # snapshot buffer, or what Bole's commit reads (decoders.bole_rows)
    budget: Optional[int] = None
    budget_source: str = ""
    nodes_per_request: Optional[list[int]] = None
    cuda_graphs: bool = False
    eager_reason: str = ""
    accept_trace: Optional[list[list[int]]] = None  # committed tokens per step and request
    streams: Optional[list[list[int]]] = None  # emitted tokens per request (exactness check)
    chain_depth: Optional[int] = None  # chain decoders: the draft depth d of this run
    tree_shape: Optional[tuple[int, int]] = None  # tree decoders: (depth, top-k) of this run
    predicted_tok_s: Optional[float] = None  # the calibration profile's price of this run
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
    """The snapshot verifier of `choice` (one of options.SNAPSHOT_ENGINES), and what it is."""
    if choice not in SNAPSHOT_ENGINES:  # a config built without check_options
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
    ver = getattr(kernels, "version", None) or SGLANG_VERSION
    return engine, (f"SGLang {ver}'s fused_sigmoid_gating_delta_rule_update (its serial tree verify, writing "
                    "a float32 snapshot per node), then the accepted snapshots copied back (one gather over "
                    "all layers)" + (f"; kernels from {src}" if src else ""))


class E2EBench:
    """The model, the drafter, the acceptance model and the three decoders. The settings
    come checked (options.check_options); what it checks is what only it learns: the
    acceptance file, the trees that file gives, whether the weights fit the GPU."""

    def __init__(self, spec: ModelSpec, *, device=DEVICE, dtype=torch.bfloat16, context: int = FULL["context"],
                 depth: int = FULL["depth"], topk: int = FULL["topk"], acceptance: "Acceptance | str" = DEFAULT_PRESET,
                 budget: "str | int" = BUDGET, seed: int = SEED, snapshot_engine: str = SNAPSHOT_ENGINE,
                 use_graphs: Optional[bool] = None, gdn_backend: str = "auto", warmup: int = FULL["warmup"],
                 steps: int = FULL["steps"], draft_vocab: Optional[int] = None):
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.context = int(context)
        self.seed = seed
        self.warmup, self.steps = int(warmup), int(steps)
        self.acceptance = (acceptance if isinstance(acceptance, Acceptance)
                           else load_e2e_acceptance(acceptance))
        self.q = self.acceptance.rows(depth, topk)
        self.layout = build_layout(depth, topk, self.q)
        self.budget_policy = budget
        self.budget_flag = "--budget"  # the option a numeric policy came from (the sweep sets it)
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else bool(use_graphs)
        self._check_weights_fit()
        self.model = HybridModel(spec, self.device, dtype, seed=seed, gdn_backend=gdn_backend)
        self.drafter = MTPDrafter(self.model, self.layout, seed=seed + 4321, draft_vocab=draft_vocab)
        self.snapshot, self.snapshot_desc = resolve_snapshot_engine(snapshot_engine, self.device)
        self.model.snapshot = self.snapshot
        self._plans: dict[tuple, TreePlan] = {}
        self.chain_depth = depth  # what a chain decoder drafts (the harness sweeps it)
        self._chains: dict[int, tuple] = {}
        self.shape = self.base_shape = (depth, topk)  # the trees' draft shape (swept)
        self._shapes = {self.shape: (self.q, self.layout, self.drafter)}

    def use_shape(self, depth: int, topk: int) -> None:
        """Draft trees of `depth` levels and `topk` drafts per expansion from now on (the same
        head and acceptance matrix; --tree-shapes)."""
        import copy

        if (depth, topk) not in self._shapes:
            q = self.acceptance.rows(depth, topk)
            layout = build_layout(depth, topk, q)
            drafter = copy.copy(self._shapes[self.shape][2])
            drafter.layout = layout
            self._shapes[(depth, topk)] = (q, layout, drafter)
        self.q, self.layout, self.drafter = self._shapes[(depth, topk)]
        self.shape = (depth, topk)

    def use_replayssm(self) -> str:
        """Load SGLang's ReplaySSM kernels for the "chain" decoder; returns where from."""
        from bole_cli.runtime.replayssm import ReplaySSMGDN
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels

        kernels = load_sglang_kernels()
        self.model.replayssm = ReplaySSMGDN(kernels)
        return (f"SGLang {kernels.version}'s ReplaySSM for GDN (--enable-linear-replayssm-spec): "
                f"gdn_replayssm_spec_decode verifies the chain from the checkpointed state and the "
                f"circular ring of earlier accepted tokens, commit_gdn_replayssm_spec / _circular "
                f"appends the accepted prefix to the ring (folded into the state when it fills); "
                f"docs/sglang-0.5.23.md; kernels from {kernels.source.describe()}")

    def _chain(self, depth: int) -> tuple:
        """(layout, drafter) of the depth-`depth` top-1 chain: the rank-1 path of the same
        acceptance matrix, drafted by the same head (shared weights)."""
        import copy

        base = self._shapes[self.base_shape][0]  # --depth x --topk: the chains' matrix
        if not 1 <= depth <= len(base):
            raise InputError(f"--chain-depths: {depth} is outside 1..{len(base)} (--depth)")
        if depth not in self._chains:
            layout = build_layout(depth, 1, [[row[0]] for row in base[:depth]])
            drafter = copy.copy(self.drafter)
            drafter.layout = layout
            self._chains[depth] = (layout, drafter)
        return self._chains[depth]

    def chain_drafter(self, depth: int) -> MTPDrafter:
        return self._chain(depth)[1]

    def chain_plan(self, batch: int, depth: int) -> TreePlan:
        """Every node of `batch` depth-`depth` chains (a chain is verified whole)."""
        layout = self._chain(depth)[0]
        key = (batch, -depth)
        if key not in self._plans:
            self._plans[key] = plan_trees(layout, batch, batch * layout.n_nodes, f"chain of depth {depth}",
                                          q=self._shapes[self.base_shape][0])
        return self._plans[key]

    # ---- sizes -------------------------------------------------------------------------
    def _check_weights_fit(self) -> None:
        if self.device.type != "cuda":
            return
        from bole_cli.runtime.model import param_bytes

        need = param_bytes(self.spec, self.dtype) + MTPDrafter.param_bytes_for(self.spec, self.dtype)
        free = torch.cuda.mem_get_info(self.device)[0]
        if need + GiB > free:
            raise BoleError(f"--model {self.spec.name}: the weights ({need / GiB:.1f} GiB with the draft head) do not "
                            f"fit in the {free / GiB:.1f} GiB free on {self.device_name}")

    def max_len(self, max_steps: int) -> int:
        """Cache positions per request: the context, every step's growth, one tree, slack.
        It is also the KV read length of every step (one graph bucket), for all decoders."""
        # every shape swept reads the same length, so AR and chains do not depend on the
        # order of --tree-shapes (the harness registers them all before the first run)
        depth = max(lay.depth for _, lay, _ in self._shapes.values())
        nodes = max(lay.n_nodes for _, lay, _ in self._shapes.values())
        grow = (max_steps + 1) * (depth + 1)
        n = self.context + grow + nodes + 1
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
                                            self.context, self.layout.n_nodes, self.drafter.hot_vocab,
                                            flag=self.budget_flag)
        key = (batch, budget) + self.shape
        if key not in self._plans:
            self._plans[key] = plan_trees(self.layout, batch, budget, source, q=self.q)
        return self._plans[key]

    def decoder(self, name: str, batch: int, max_steps: int, *, override=None) -> Decoder:
        return decoder_class(name).build(self, batch, max_steps, override=override)

    # ---- one (decoder, batch) ------------------------------------------------------------
    @torch.inference_mode()
    def run(self, name: str, batch: int) -> RunResult:
        res = RunResult(name, batch)
        kind = decoder_class(name)
        if kind.drafts:
            plan = kind.plan_for(self, batch)
            res.budget, res.budget_source = plan.budget, plan.source
            res.nodes_per_request = list(plan.sizes)
            res.expected_accepted = plan.expected
        else:
            res.expected_accepted = 1.0
        dec = None
        try:
            # with graphs, a step's first run is eager and its second captures: two at least
            warm = max(self.warmup, 2) if self.use_graphs else self.warmup
            dec = self.decoder(name, batch, warm + self.steps + 1)
            for _ in range(warm):
                dec.step()
            _sync(self.device)
            all_marks, hosts = [], []
            t0 = time.perf_counter()
            for _ in range(self.steps):
                marks, host = dec.step()
                all_marks.append(marks)
                hosts.append(host)
            _sync(self.device)
            res.wall_s = time.perf_counter() - t0
            timed = dec.accepted[warm:]
            res.steps = self.steps
            res.tokens = sum(map(sum, timed))
            res.tok_s = res.tokens / res.wall_s
            res.mean_accepted = res.tokens / (self.steps * batch)
            res.step_ms = 1e3 * res.wall_s / self.steps
            res.phase_ms = {ph: 1e3 * sum(dec.clock.seconds(mk[i], mk[i + 1]) for mk in all_marks) / self.steps
                            for i, ph in enumerate(PHASES)}
            res.host_ms = 1e3 * sum(hosts) / self.steps
            res.cuda_graphs, res.eager_reason = dec.graphs.enabled, dec.graphs.reason
            dec.graphs.clear()
            free_memory(self.device)
            mem: dict = {}
            dec.step(eager=True, mem=mem)  # one more step, eager, for the memory peaks
            if self.device.type == "cuda":
                res.verify_peak_bytes = mem.get("verify_peak")
                res.peak_transient_bytes = max(mem.get("draft_peak", 0), mem.get("verify_peak", 0))
            res.verify_state_bytes = mem.get("verify_state_bytes")
            res.accept_trace = dec.accepted
            res.streams = dec.streams
        except Exception as exc:  # noqa: BLE001 - keep the other decoders' results; the error is reported
            res.error = "out of memory" if _is_oom(exc) else f"{type(exc).__name__}: {exc}"
            res.tok_s = None
        finally:
            dec = None
            free_memory(self.device)
        return res

    # ---- the largest batch ---------------------------------------------------------------
    @torch.inference_mode()
    def fits(self, name: str, batch: int, nodes_per_request: int) -> tuple[bool, str]:
        """One eager step of `name` at `batch` with the KV cache at the context (tree
        decoders: `nodes_per_request` tree tokens per request); False on an allocation failure."""
        ok, why = True, ""
        cache = None
        try:
            cache = self.new_cache(batch, self.context + nodes_per_request + 2, fill=False)
            decoder_class(name).probe(self, cache, batch, nodes_per_request)
            _sync(self.device)
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                ok, why = False, f"{type(exc).__name__}: {exc}"
            else:
                ok, why = False, "out of memory"
        finally:
            cache = None
            free_memory(self.device)
        return ok, why

    def max_batch(self, name: str, *, max_batch: int, max_probes: int, nodes_per_request: int,
                  progress: Callable[[str], None] = lambda _: None) -> dict:
        if self.device.type != "cuda":
            return {"max_batch": None, "skipped": "needs CUDA (allocation failures on CPU mean host RAM)"}

        def fits(b):
            progress(f"largest batch, {LABELS[name]}: trying {b}")
            return self.fits(name, b, nodes_per_request)

        found = search_max_batch(fits, max_batch, max_probes)
        found["nodes_per_request"] = nodes_per_request if decoder_class(name).drafts else 0
        return found
