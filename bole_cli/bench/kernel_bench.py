"""Side-by-side GPU timing of one GDN layer's tree verify + commit: SGLang 0.5.23 vs Bole.

(a) SGLang: `fused_sigmoid_gating_delta_rule_update` exactly as TritonGDNKernel.target_verify
    calls it (gates fused, a float32 snapshot per node into intermediate_states_buffer),
    then the copy of each request's accepted snapshot back into the pool
    (fused_mamba_state_scatter_with_mask, as update_mamba_state_after_mtp_verify does).
(b) Bole as served (docs/design.md §9): tree_verify_gated (tf32 dots for 16-bit activations,
    no factors: the replay commit reads none) + tree_commit_replay_gated (the accepted path
    replayed exactly in float32) on the same inputs; beside it (b') the factorised path
    served before: tree_verify_gated + tree_commit.
(c) The memory-traffic floor: bytes that must move / measured device copy bandwidth.
(d) For chains, SGLang's ReplaySSM as a GDN model runs it (`--enable-linear-replayssm-spec`):
    the circular ring. The verify reconstructs every draft position's output from the
    frozen checkpoint plus the ring's committed history and writes the window's update
    vectors, keys and decays into the ring; the commit advances each request's cursors by
    its accepted length and materialises the ring into the state only when it is due
    (every commit for a bf16 pool, else when the next window could overflow the ring).
    Called as gdn_backend.py and spec_utils.py call them (`SGLangKernels.replayssm_ring_*`,
    docs/sglang-0.5.23.md "ReplaySSM"); timed in steady state (`time_steady`): a graph
    replay runs STEADY_STEPS consecutive steps on the same rings, so it holds its share of
    the flushes that come every few steps. The ring length is `ring_len_for(nodes)`
    (SGLang's default 16, raised for longer windows).
(e) The fold protocol (0.5.23 runs it for KDA models only; labelled "KDA fold"): verify
    into a raw-input window, then replay the accepted prefix into the state.
(f) For chains, Bole's deferred write (bench/deferred_write.py): the accepted rows held in
    the forest above the next draft and folded into the state by the replay commit when a
    segment as long as the ring is full; timed like the ring (`time_steady`), with or
    without SGLang.

Every SGLang path is checked against Bole on the same inputs before it is timed (outputs
and the committed state, `AGREEMENT`; the ring over CHECK_STEPS consecutive steps, so its
committed history is read); a case outside the tolerances is listed in
`KernelBenchResult.disagreements`, so a mis-called baseline cannot pass as a fast one.

Timing (bole_cli.timing): each variant is captured in a CUDA graph that runs it over ROTATE
input sets (so repeated runs do not measure the L2 cache), replayed under
triton.testing.do_bench (CUDA events, warm-up, median); the per-call time is the replay
time / ROTATE.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from bole_cli.bench.deferred_write import PendingChains, deferred_width
from bole_cli.catalog.models import ModelSpec
from bole_cli.timing import ROTATE, LayerInputs, measure_copy_bandwidth, time_graph, warm_gpu


@dataclass
class KernelCase:
    batch: int
    nodes: int
    tree: str  # "random" (depth <= 8) or "chain"
    sglang_us: Optional[float] = None
    bole_us: Optional[float] = None
    bole_verify_us: Optional[float] = None
    bole_commit_us: Optional[float] = None
    # the factorised path served before (tf32 verify, gates fused, Eq. 10's commit), same inputs
    factors_us: Optional[float] = None
    factors_commit_us: Optional[float] = None
    floor_us: float = 0.0
    floor_bytes: int = 0
    sglang_transient_bytes: int = 0
    bole_transient_bytes: int = 0
    max_rel_diff_o: Optional[float] = None
    max_rel_diff_state: Optional[float] = None
    # chains: ReplaySSM's circular ring (GDN's protocol), verify + commit in steady state
    replayssm_us: Optional[float] = None
    replayssm_verify_us: Optional[float] = None
    replayssm_commit_us: Optional[float] = None
    replayssm_cache_len: Optional[int] = None  # the ring length
    replayssm_diff_o: Optional[float] = None  # worst relative difference from Bole's o
    replayssm_diff_state: Optional[float] = None  # materialised ring vs Bole's committed state
    fold_us: Optional[float] = None  # chains: the fold protocol (KDA's), verify + fold
    fold_diff_o: Optional[float] = None
    fold_diff_state: Optional[float] = None
    replayssm_error: Optional[str] = None  # the ReplaySSM baselines did not run: why
    # chains: Bole's deferred write (bench/deferred_write.py), steady state like the ring
    deferred_us: Optional[float] = None
    deferred_verify_us: Optional[float] = None  # place + verify + the drafts' o gathered
    deferred_commit_us: Optional[float] = None  # advance + the folds that are due
    deferred_width: Optional[int] = None  # rows a request's segment holds (the ring's length)
    deferred_diff_o: Optional[float] = None  # worst relative difference from the served step's o
    deferred_diff_state: Optional[float] = None  # settled state vs the served step's committed state
    deferred_error: Optional[str] = None  # the deferred write did not run: why

    @property
    def bole_over_replayssm(self) -> Optional[float]:
        """Bole's verify + commit time over ReplaySSM's ring verify + commit (below 1: Bole faster)."""
        if self.replayssm_us and self.bole_us:
            return self.bole_us / self.replayssm_us
        return None

    @property
    def deferred_over_replayssm(self) -> Optional[float]:
        """The deferred write's verify + commit time over the ring's (below 1: Bole faster)."""
        if self.replayssm_us and self.deferred_us:
            return self.deferred_us / self.replayssm_us
        return None

    @property
    def speedup(self) -> Optional[float]:
        if self.sglang_us and self.bole_us:
            return self.sglang_us / self.bole_us
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speedup"] = self.speedup
        d["bole_over_replayssm"] = self.bole_over_replayssm
        d["deferred_over_replayssm"] = self.deferred_over_replayssm
        d["pct_of_floor"] = (100.0 * self.floor_us / self.bole_us) if self.bole_us else None
        return d


@dataclass
class CommitCase:
    layers: int
    batch: int
    bole_us: float
    sglang_copy_us: Optional[float]
    floor_us: float
    floor_bytes: int
    factors_us: Optional[float] = None  # Eq. 10's factorised commit, the same work


@dataclass
class KernelBenchResult:
    device: str
    versions: dict
    model: str
    copy_bandwidth: float  # bytes/s, read + written
    cases: list[KernelCase] = field(default_factory=list)
    commits: list[CommitCase] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C: the cells measured before it, no all-layer commit

    def to_dict(self) -> dict:
        return {
            "device": self.device, "versions": self.versions, "model": self.model,
            "interrupted": self.interrupted,
            "copy_bandwidth_tb_s": self.copy_bandwidth / 1e12,
            "cases": [c.to_dict() for c in self.cases],
            "commits": [asdict(c) for c in self.commits],
            "notes": self.notes,
            "disagreements": self.disagreements,
        }


# Largest relative (Frobenius) difference accepted between two paths on the same inputs:
# o is stored in the activation dtype (bf16: ~4e-3 per element); the committed state is
# float32 or bfloat16 (rounded once per commit). The ring's float32 state gets more room:
# its update vectors come from TF32 dots (SGLang's default precision on SM80+) and are
# stored as bf16 high + low parts; a mis-called ring differs by O(1) (tests/test_replayssm_ring.py).
AGREEMENT = {"o": 3e-2, "state float32": 1e-3, "state bfloat16": 2e-2, "ring state float32": 5e-3,
             "ring state bfloat16": 2e-2}
CHECK_STEPS = 3  # consecutive ring steps checked against Bole before timing
# Consecutive steps one graph replay of a stateful protocol (the ring, the deferred write)
# runs: at least one flush or fold cycle at every chain the bench times (a request of a
# chain of 2 fills the ring's 16 rows in 7-14 steps). Timed one step a replay, the median
# replay would be one without a flush, which comes every few steps: the flush dropped.
STEADY_STEPS = 16


def time_steady(torch, steps_by_set: list[list[Callable[[], None]]]) -> float:
    """Microseconds a step of a protocol whose state carries over from step to step: one
    graph replays STEADY_STEPS consecutive steps of every input set, the sets interleaved
    (no set's inputs stay in L2 from one of its steps to the next); median replay / (sets x
    steps). steps_by_set[i]: the calls of one step of set i, in order."""
    fns = [f for _ in range(STEADY_STEPS) for step in steps_by_set for f in step]
    return time_graph(torch, fns, calls=STEADY_STEPS * len(steps_by_set))


def check_agreement(case: KernelCase, state_dtype: str) -> list[str]:
    """The case's differences outside `AGREEMENT`, one line each (empty: all paths agree)."""
    where = f"{case.tree} batch {case.batch} x {case.nodes}"
    state_tol = AGREEMENT[f"state {state_dtype}"]
    out = []
    for label, value, tol in (("snapshot o", case.max_rel_diff_o, AGREEMENT["o"]),
                              ("snapshot state", case.max_rel_diff_state, state_tol),
                              ("ReplaySSM o", case.replayssm_diff_o, AGREEMENT["o"]),
                              ("ReplaySSM state", case.replayssm_diff_state, AGREEMENT[f"ring state {state_dtype}"]),
                              ("KDA fold o", case.fold_diff_o, AGREEMENT["o"]),
                              ("KDA fold state", case.fold_diff_state, state_tol),
                              ("deferred o", case.deferred_diff_o, AGREEMENT["o"]),
                              ("deferred state", case.deferred_diff_state, state_tol)):
        if value is not None and not value <= tol:  # NaN fails too
            out.append(f"{where}: {label} differs from Bole's by {value:.2e} (tolerance {tol:.0e})")
    return out


def sglang_step(s: LayerInputs, sg) -> Callable[[], None]:
    """(a) SGLang: verify with a snapshot per node, then copy the accepted one back."""

    def run():
        sg.target_verify(
            s.A_log, s.dt_bias, s.q[None], s.k[None], s.v[None], s.a, s.b,
            ssm_states=s.pool, cache_indices=s.slots, query_start_loc=s.cu,
            intermediate_states_buffer=s.snapshots, intermediate_state_indices=s.snap_rows,
            cache_steps=s.nodes, retrieve_parent_token=s.rpt,
        )
        sg.copy_back_accepted(s.pool[None], s.snapshots[None], s.slots, s.accepted)
    return run


def ring_verify(s: LayerInputs, sg, ring: dict, replay) -> Callable[[], None]:
    """(d) ReplaySSM's ring verify (one layer): o from checkpoint + history, window into the ring."""
    layer = sg.ring_layer(ring, 0)

    def run():
        sg.replayssm_ring_verify(s.A_log, s.dt_bias, s.q[None], s.k[None], s.v[None], s.a, s.b,
                                 checkpoint_state=s.pool, ring=layer, cache_indices=s.slots,
                                 replay_indices=replay, query_start_loc=s.cu, draft_token_num=s.nodes)
    return run


def ring_commit(s: LayerInputs, sg, ring: dict, replay, accept_lens) -> Callable[[], None]:
    """(d) ReplaySSM's ring commit: cursors advanced, the ring materialised when due."""
    pool = s.pool[None]

    def run():
        sg.replayssm_ring_commit(pool, ring, s.slots, replay, accept_lens, s.nodes)
    return run


def fold_step(s: LayerInputs, sg, rings: dict, accept_lens) -> Callable[[], None]:
    """(e) The fold protocol (KDA's): verify into the raw-input window, fold the accepted prefix."""
    layer = {name: r[0] for name, r in rings.items()}
    pool = s.pool[None]

    def run():
        sg.replayssm_verify(s.A_log, s.dt_bias, s.q[None], s.k[None], s.v[None], s.a, s.b,
                            ssm_states=s.pool, cache_indices=s.slots, query_start_loc=s.cu, rings=layer)
        sg.replayssm_fold(pool, rings, s.slots, accept_lens)
    return run


def rel_diff(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def bole_verify(s: LayerInputs, kernels, out, config=None) -> Callable[[], None]:
    """(b) Bole as served (docs/design.md §9): the closed-form verify, gates fused (then
    `bole_commit`)."""

    def run():
        kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots, s.parents, s.cu,
                                  check_trees=False, max_nodes=s.nodes, max_depth=s.max_depth, out=out,
                                  config=config, factors=False)
    return run


def bole_commit(s: LayerInputs, kernels) -> Callable[[], None]:
    """(b) The served commit: the accepted path replayed in float32 from the verify's inputs
    (tree_commit_replay, gates fused)."""

    def run():
        kernels.tree_commit_replay_gated(s.pool, s.slots, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.parents, s.cu,
                                         s.accepted, check_trees=False, max_nodes=s.nodes, max_depth=s.max_depth)
    return run


def factors_step(s: LayerInputs, kernels, out, config=None) -> list[Callable[[], None]]:
    """(b') The factorised path that was served before (gates fused into the verify, Eq. 10's
    commit from the verify's u): timed beside the served path in every cell. The commit reads
    what the verify wrote into `out`: run the verify first."""

    def verify():
        kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias,
                                  s.pool, s.slots, s.parents, s.cu, check_trees=False,
                                  max_nodes=s.nodes, max_depth=s.max_depth, out=out, config=config)

    def commit():
        kernels.tree_commit(s.pool, s.slots, s.k, out.u, out.log_p, s.parents, s.cu, s.accepted, check_trees=False)
    return [verify, commit]


def time_factors(torch, factors: list[Callable[[], None]], calls: int) -> tuple[float, float]:
    """(verify + commit, commit alone) in us a call of the factorised path's [verify, commit,
    ...] closures. The pairs first: Eq. 10's commit reads the u and log_p its verify writes,
    which the served verify (factors=False) leaves unwritten in the buffers both share; timed
    alone before them, it would commit uninitialised memory into the pools (experiments/NOTES.md
    "Measured on the H200 in the sixth session")."""
    both = time_graph(torch, factors, calls=calls)
    return both, time_graph(torch, factors[1::2])


def floor_bytes(s: LayerInputs, spec: ModelSpec) -> int:
    """Bytes that must move: state read once; q, k, v, a, b read; o, u, log_p written;
    the accepted states read and written back."""
    el = s.q.element_size()
    n, hv, vd, kd = s.q.shape[0], spec.gdn_value_heads, spec.gdn_value_dim, spec.gdn_key_dim
    state = s.batch * hv * vd * kd * s.pool.element_size()
    inputs = n * (2 * spec.gdn_key_heads * kd + hv * vd + 2 * hv) * el
    outputs = n * hv * vd * (el + 4) + n * hv * 4
    return state + inputs + outputs + 2 * state


def run_kernel_bench(spec: ModelSpec, batches, nodes_list, trees, *, act_dtype="bfloat16",
                     state_dtype="float32", with_sglang=True, commit_layers=True, precision=None,
                     progress: Optional[Callable[[str], None]] = None) -> KernelBenchResult:
    import torch
    import triton

    from bole_cli import __version__
    from bole_cli import kernels
    from bole_cli.kernels.types import VerifyResult
    from bole_cli.kernels.tree_verify import verify_scratch_bytes
    from bole_cli.memory import factor_bytes_per_node_layer, snapshot_bytes_per_node_layer

    act = getattr(torch, act_dtype)
    sdt = getattr(torch, state_dtype)
    config = {"precision": precision} if precision else None  # None: the kernels' own choice
    # the factorised path beside it: at the asked precision, else at the tables' tf32
    factors_config = config or ({"precision": "tf32"} if act != torch.float32 else None)
    sg = None
    notes = []
    if with_sglang:
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels

        sg = load_sglang_kernels()
        notes.append(f"SGLang kernels from {sg.source.describe()}")
    versions = {"torch": torch.__version__, "triton": triton.__version__, "bole": __version__,
                "sglang": getattr(sg, "version", None)}
    warm_gpu(torch)
    bw = measure_copy_bandwidth(torch)
    result = KernelBenchResult(torch.cuda.get_device_name(), versions, spec.name, bw, notes=notes)
    snap_node = snapshot_bytes_per_node_layer(spec, "float32")
    fact_node = factor_bytes_per_node_layer(spec)
    try:
        for tree in trees:
            for batch in batches:
                for nodes in nodes_list:
                    if progress:
                        progress(f"{tree} tree, batch {batch}, {nodes} nodes")
                    # SGLang's snapshot buffers only when it runs (64 x 256 nodes: 32 GiB a set at 9B)
                    sets = [LayerInputs(torch, spec, batch, nodes, tree, 1000 * i + batch * 7 + nodes, act, sdt,
                                        sglang_buffers=sg is not None) for i in range(ROTATE)]
                    case = KernelCase(batch, nodes, tree)
                    n = batch * nodes
                    outs = [VerifyResult.like(s.v) for s in sets]
                    verify = [bole_verify(s, kernels, o, config) for s, o in zip(sets, outs)]
                    commit = [bole_commit(s, kernels) for s in sets]
                    case.bole_verify_us = time_graph(torch, verify)
                    case.bole_commit_us = time_graph(torch, commit)
                    case.bole_us = time_graph(torch, [f for pair in zip(verify, commit) for f in pair], calls=len(sets))
                    factors = [f for s, o in zip(sets, outs) for f in factors_step(s, kernels, o, factors_config)]
                    case.factors_us, case.factors_commit_us = time_factors(torch, factors, len(sets))
                    if tree == "chain" and deferred_width(nodes):
                        try:
                            _bench_deferred(torch, kernels, sets, case, config)
                        except Exception as exc:  # noqa: BLE001 - a finding to report, not a crash
                            torch.cuda.synchronize()
                            case.deferred_error = f"{type(exc).__name__}: {exc}"[:400]
                            case.deferred_us = case.deferred_verify_us = case.deferred_commit_us = None
                            result.notes.append(f"the deferred write did not run at chain batch {batch} x {nodes}: "
                                                f"{case.deferred_error}")
                    if sg is not None:
                        # same inputs: check agreement before timing (the pool is read only here)
                        s0 = sets[0]
                        pool0 = s0.pool.clone()
                        verify[0]()
                        o_bole = outs[0].o.float().clone()
                        sg_o = sg.target_verify(
                            s0.A_log, s0.dt_bias, s0.q[None], s0.k[None], s0.v[None], s0.a, s0.b,
                            ssm_states=s0.pool, cache_indices=s0.slots, query_start_loc=s0.cu,
                            intermediate_states_buffer=s0.snapshots, intermediate_state_indices=s0.snap_rows,
                            cache_steps=nodes, retrieve_parent_token=s0.rpt)
                        o_sg = sg_o[0].reshape(o_bole.shape).float() if isinstance(sg_o, torch.Tensor) else sg_o[0]
                        case.max_rel_diff_o = ((o_bole - o_sg).norm() / o_sg.norm()).item()
                        commit[0]()
                        idx = s0.accepted.long()
                        want = s0.snapshots[torch.arange(batch, device="cuda"), idx]
                        got = s0.pool[s0.slots.long()].float()
                        case.max_rel_diff_state = ((got - want).norm() / want.norm()).item()
                        bole_state = got.clone()
                        s0.pool.copy_(pool0)
                        case.sglang_us = time_graph(torch, [sglang_step(s, sg) for s in sets])
                        if tree == "chain":
                            try:
                                _bench_replayssm(torch, sg, kernels, sets, case, o_bole, bole_state, pool0, act)
                            except Exception as exc:  # noqa: BLE001 - a finding to report, not a crash
                                torch.cuda.synchronize()
                                case.replayssm_error = f"{type(exc).__name__}: {exc}"[:400]
                                case.replayssm_us = case.fold_us = None
                                result.notes.append(f"ReplaySSM did not run at chain batch {batch} x {nodes}: "
                                                    f"{case.replayssm_error}")
                    result.disagreements.extend(check_agreement(case, state_dtype))
                    bytes_ = floor_bytes(sets[0], spec)
                    case.floor_bytes = bytes_
                    case.floor_us = bytes_ / bw * 1e6
                    case.sglang_transient_bytes = n * snap_node
                    # the per-node factors, plus the big-tree kernel's scratch while it runs
                    case.bole_transient_bytes = n * fact_node + verify_scratch_bytes(
                        n, batch, spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim,
                        nodes, sets[0].max_depth)
                    result.cases.append(case)
                    del sets, outs, verify, commit
                    torch.cuda.empty_cache()
    except KeyboardInterrupt:  # keep the cells measured so far (on the host); the command writes them
        result.interrupted = True
        return result
    if commit_layers:
        result.commits.append(_bench_commit_all_layers(torch, kernels, spec, 16, sg, bw))
    return result


def ring_agreement(torch, sg, kernels, sets, pool0, act, length: int) -> tuple[float, float]:
    """The ring against Bole over CHECK_STEPS consecutive steps on set 0's pool (reset to
    pool0) and slots, step i with set i's inputs and accepted lengths, Bole's verify +
    commit on a copy of pool0: the worst relative o and committed-state differences (the
    ring's committed state read by SGLang's own materialisation, on a copy). Any device."""
    from bole_cli.kernels.types import VerifyResult

    s0, nodes = sets[0], sets[0].nodes
    dev = s0.pool.device
    replay = torch.arange(s0.batch, dtype=torch.int32, device=dev)  # SGLang: req_pool_indices
    s0.pool.copy_(pool0)
    ring = sg.replayssm_ring(s0.pool[None], s0.batch, s0.q.shape[1], act, length)
    bole_pool = pool0.clone()
    out = VerifyResult.like(s0.v)
    diff_o = diff_state = 0.0
    sel = s0.slots.long()
    for step in range(CHECK_STEPS):
        x = sets[step % len(sets)]
        o = sg.replayssm_ring_verify(x.A_log, x.dt_bias, x.q[None], x.k[None], x.v[None], x.a, x.b,
                                     checkpoint_state=s0.pool, ring=sg.ring_layer(ring, 0), cache_indices=s0.slots,
                                     replay_indices=replay, query_start_loc=x.cu, draft_token_num=nodes)
        kernels.tree_verify_gated(x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, bole_pool, s0.slots, x.parents,
                                  x.cu, max_nodes=nodes, out=out)
        diff_o = max(diff_o, rel_diff(o.reshape(out.o.shape), out.o))
        n = (x.accepted + 1).to(torch.int32)  # accepted drafts + the bonus token
        sg.replayssm_ring_commit(s0.pool[None], ring, s0.slots, replay, n, nodes)
        kernels.tree_commit_replay_gated(bole_pool, s0.slots, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.parents, x.cu,
                                         n - 1)
        copy_pool = s0.pool[None].clone()
        sg.replayssm_ring_materialize(copy_pool, {k: None if t is None else t.clone() for k, t in ring.items()},
                                      s0.slots, replay)
        diff_state = max(diff_state, rel_diff(copy_pool[0, sel], bole_pool[sel]))
    s0.pool.copy_(pool0)
    return diff_o, diff_state


def deferred_agreement(torch, kernels, sets, pool0, width: int, config: Optional[dict] = None,
                       steps: Optional[int] = None) -> tuple[float, float]:
    """The deferred write against the served step over `steps` consecutive steps (default:
    enough that every request that accepts a node each step folds at least once) on set
    0's pool (reset to pool0) and gate parameters, step i with set i's draft and accepted
    nodes: the worst relative difference of the drafts' o and of the committed state
    (`PendingChains.settled` against the served pool). Leaves set 0's pool at pool0. Any
    device."""
    from bole_cli.kernels.types import DraftRows, VerifyResult

    s0 = sets[0]
    steps = steps or max(3, width - s0.nodes + 1)  # at least one row held a step: a fold by then
    s0.pool.copy_(pool0)
    chains = PendingChains(torch, s0, width, config)
    served = pool0.clone()
    out = VerifyResult.like(s0.v)
    sel = s0.slots.long()
    diff_o = diff_state = 0.0
    for step in range(steps):
        x = sets[step % len(sets)]
        kernels.tree_verify_gated(x.q, x.k, x.v, x.a, x.b, s0.A_log, s0.dt_bias, served, s0.slots, x.parents, x.cu,
                                  max_nodes=x.nodes, out=out, config=config)
        kernels.tree_commit_replay_gated(served, s0.slots, x.k, x.v, x.a, x.b, s0.A_log, s0.dt_bias, x.parents,
                                         x.cu, x.accepted)
        chains.verify(torch, kernels, DraftRows(x.q, x.k, x.v, x.a, x.b))
        diff_o = max(diff_o, rel_diff(chains.o, out.o))
        chains.commit(kernels, x.accepted)
        diff_state = max(diff_state, rel_diff(chains.settled(kernels)[sel], served[sel]))
    s0.pool.copy_(pool0)
    return diff_o, diff_state


def _bench_replayssm(torch, sg, kernels, sets, case: KernelCase, o_bole, bole_state, pool0, act) -> None:
    """ReplaySSM on the chain inputs: the ring's agreement (`ring_agreement`), the fold's
    over one step against Bole's (o_bole, bole_state, both from pool0); then each timed
    like Bole's (the ring's verify, commit and both in steady state; the fold whole)."""
    from bole_cli.sglang.baseline_kernels import ring_len_for

    s0, batch, nodes = sets[0], sets[0].batch, sets[0].nodes
    length = case.replayssm_cache_len = ring_len_for(nodes)
    case.replayssm_diff_o, case.replayssm_diff_state = ring_agreement(torch, sg, kernels, sets, pool0, act, length)
    replay = torch.arange(batch, dtype=torch.int32, device="cuda")
    lens = [(s.accepted + 1).to(torch.int32) for s in sets]
    key_heads = s0.q.shape[1]
    rings = [sg.replayssm_ring(s.pool[None], batch, key_heads, act, length) for s in sets]
    verify = [ring_verify(s, sg, r, replay) for s, r in zip(sets, rings)]
    commit = [ring_commit(s, sg, r, replay, n) for s, r, n in zip(sets, rings, lens)]
    case.replayssm_verify_us = time_steady(torch, [[v] for v in verify])
    case.replayssm_commit_us = time_steady(torch, [[c] for c in commit])
    case.replayssm_us = time_steady(torch, [[v, c] for v, c in zip(verify, commit)])
    del rings, verify, commit

    s0.pool.copy_(pool0)
    windows = [sg.replayssm_rings(s.pool[None], nodes, key_heads, act) for s in sets]
    o = sg.replayssm_verify(s0.A_log, s0.dt_bias, s0.q[None], s0.k[None], s0.v[None], s0.a, s0.b,
                            ssm_states=s0.pool, cache_indices=s0.slots, query_start_loc=s0.cu,
                            rings={name: r[0] for name, r in windows[0].items()})
    case.fold_diff_o = rel_diff(o.reshape(o_bole.shape), o_bole)
    sg.replayssm_fold(s0.pool[None], windows[0], s0.slots, lens[0])
    case.fold_diff_state = rel_diff(s0.pool[s0.slots.long()], bole_state)
    s0.pool.copy_(pool0)
    case.fold_us = time_graph(torch, [fold_step(s, sg, w, n) for s, w, n in zip(sets, windows, lens)])


def _bench_deferred(torch, kernels, sets, case: KernelCase, config) -> None:
    """Bole's deferred write on the chain inputs: its agreement with the served step over
    consecutive steps (`deferred_agreement`, every request folding), then its verify, commit
    and both timed in steady state like the ring's (`time_steady`), each input set on its
    own pool."""
    width = case.deferred_width = deferred_width(case.nodes)
    pool0 = sets[0].pool.clone()
    case.deferred_diff_o, case.deferred_diff_state = deferred_agreement(torch, kernels, sets, pool0, width, config)
    chains = [PendingChains(torch, s, width, config) for s in sets]
    verify = [lambda c=c: c.verify(torch, kernels) for c in chains]
    commit = [lambda c=c, s=s: c.commit(kernels, s.accepted) for c, s in zip(chains, sets)]
    case.deferred_verify_us = time_steady(torch, [[v] for v in verify])
    case.deferred_commit_us = time_steady(torch, [[c] for c in commit])
    case.deferred_us = time_steady(torch, [[v, c] for v, c in zip(verify, commit)])


def _bench_commit_all_layers(torch, kernels, spec: ModelSpec, batch: int, sg, bw) -> CommitCase:
    """One launch committing every GDN layer of the model at `batch` (random depth-8 trees of 64):
    the served replay commit, and beside it Eq. 10's factorised commit."""
    layers, nodes = spec.n_gdn_layers, 64
    h, hv, kd, vd = spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim
    base = LayerInputs(torch, spec, batch, nodes, "random", 7, torch.bfloat16, torch.float32, sglang_buffers=False)
    n = batch * nodes
    pool = torch.randn(layers, batch + 1, hv, vd, kd, device="cuda")
    k = torch.randn(layers, n, h, kd, device="cuda").to(torch.bfloat16)
    u = torch.randn(layers, n, hv, vd, device="cuda")
    v = u.to(torch.bfloat16)
    log_p = -torch.rand(layers, n, hv, device="cuda")
    beta = torch.rand(layers, n, hv, device="cuda")

    def commit():
        kernels.tree_commit_replay(pool, base.slots, k, v, log_p, beta, base.parents, base.cu, base.accepted,
                                   check_trees=False, max_nodes=nodes, max_depth=base.max_depth)

    def factors():
        kernels.tree_commit(pool, base.slots, k, u, log_p, base.parents, base.cu, base.accepted, check_trees=False)

    bole = time_graph(torch, [commit])
    factors_us = time_graph(torch, [factors])
    sg_us = None
    if sg is not None:
        # the copy reads one snapshot per request, so a short buffer times the same work
        steps = 8
        snaps = torch.randn(layers, batch, steps, hv, vd, kd, device="cuda")
        acc = base.accepted % steps
        sg_us = time_graph(torch, [lambda: sg.copy_back_accepted(pool, snaps, base.slots, acc)])
        del snaps
    floor_bytes = 2 * layers * batch * hv * vd * kd * 4
    return CommitCase(layers, batch, bole, sg_us, floor_bytes / bw * 1e6, floor_bytes, factors_us)


def geomean(xs) -> Optional[float]:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
