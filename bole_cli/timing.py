"""GPU timing shared by `bole bench kernels`, `bole tune-kernels` and the calibration timer
(docs/design.md §3, §5, §8): one GDN layer's inputs, CUDA-graph capture and timing.

Inputs: `LayerInputs` builds one GDN layer's realistic verify inputs for a batch of
same-size trees (random trees of depth <= 8 or chains, bf16 activations, a float32 state
pool), `ConvInputs` the conv inputs. ROTATE such sets are timed together so repeated
replays do not measure the L2 cache.

Timing: every closure is warmed up on a side stream and captured in one CUDA graph
(`capture_graph`), replayed under triton.testing.do_bench (CUDA events, L2 flushed between
replays, median: `replay_ms`); `time_graph` does both. `warm_gpu` ramps the clocks first.
`seconds_per_call` times a step with CUDA events (or the wall clock on a CPU).

torch is passed in (or imported inside the functions), so importing this module is light.
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional

from bole_cli.memory import GiB

ROTATE = 4  # input sets timed together


# ---- inputs -------------------------------------------------------------------------------

RANDOM_TREE_DEPTH = 8  # the benches' random trees: at most this many levels, the root's counted


def depth_promise(kind: str, nodes: int) -> int:
    """The strict ancestors of the deepest node of a `kind` tree of `nodes` at most: the
    max_depth the benches and the tuner promise the verify and the commit."""
    return nodes - 1 if kind == "chain" else min(RANDOM_TREE_DEPTH - 1, nodes - 1)


def tree_parents(kind: str, nodes: int, rng: random.Random) -> list[int]:
    """One request's local parents: a random tree of depth <= 8 (one root, like SGLang's
    drafts), or a pure chain."""
    from bole_cli.trees import random_tree

    if kind == "chain":
        return list(random_tree(rng, nodes, shape="chain").parents)
    return list(random_tree(rng, nodes, max_depth=RANDOM_TREE_DEPTH, n_roots=1, shape="random").parents)


class LayerInputs:
    """One GDN layer's verify inputs for a batch of same-size trees, on the GPU (or `device`,
    for a smoke run under the interpreter).

    spec: anything with the ModelSpec's gdn_* head counts and dims. sglang_buffers: also
    SGLang's per-node snapshot buffer (B*T*HV*V*K*4 bytes), its rows and
    retrieve_parent_token, which only the SGLang side of `bole bench kernels` needs.
    """

    def __init__(self, torch, spec, batch: int, nodes: int, tree: str, seed: int, act_dtype, state_dtype,
                 *, sglang_buffers: bool = True, device: str = "cuda"):
        dev = device
        rng = random.Random(seed)
        gen = torch.Generator(device=dev).manual_seed(seed)
        h, hv, kd, vd = spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim
        n = batch * nodes
        self.batch, self.nodes = batch, nodes
        self.max_depth = depth_promise(tree, nodes)
        local = []
        for _ in range(batch):
            local.extend(tree_parents(tree, nodes, rng))
        self.parents = torch.tensor(local, dtype=torch.int32, device=dev)
        self.cu = torch.arange(0, n + 1, nodes, dtype=torch.int32, device=dev)
        if sglang_buffers:
            # SGLang's retrieve_parent_token: [B, T], entry 0 unused (0), else the local parent.
            rpt = self.parents.view(batch, nodes).clone()
            rpt[:, 0] = 0
            self.rpt = rpt.contiguous()

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=dev)

        self.q = randn(n, h, kd).to(act_dtype)
        self.k = randn(n, h, kd).to(act_dtype)
        self.v = randn(n, hv, vd).to(act_dtype)
        self.a = randn(n, hv).to(act_dtype)
        self.b = randn(n, hv).to(act_dtype)
        self.A_log = (torch.rand(hv, generator=gen, device=dev) * 2.0 - 1.0).float()
        self.dt_bias = randn(hv).float()
        slots = batch + 1
        self.pool = randn(slots, hv, vd, kd).to(state_dtype)
        self.slots = torch.randperm(slots, generator=gen, device=dev)[:batch].to(torch.int32)
        self.accepted = torch.tensor([rng.randint(0, nodes - 1) for _ in range(batch)],
                                     dtype=torch.int32, device=dev)
        if sglang_buffers:
            self.snapshots = torch.empty(batch, nodes, hv, vd, kd, dtype=torch.float32, device=dev)
            self.snap_rows = torch.arange(batch, dtype=torch.int32, device=dev)

    @classmethod
    def for_dims(cls, torch, dims: Mapping[str, int], batch: int, nodes: int, seed: int, act_dtype,
                 state_dtype) -> "LayerInputs":
        """Random-tree inputs for a GDN shape {H, HV, K, V} (a tuning bucket's), without the
        SGLang-only buffers."""
        spec = SimpleNamespace(gdn_key_heads=dims["H"], gdn_value_heads=dims["HV"],
                               gdn_key_dim=dims["K"], gdn_value_dim=dims["V"])
        return cls(torch, spec, batch, nodes, "random", seed, act_dtype, state_dtype, sglang_buffers=False)


class ConvInputs:
    """One GDN layer's conv inputs for `batch` same-size random trees (depth <= 8)."""

    def __init__(self, torch, dim: int, width: int, batch: int, nodes: int, seed: int, act_dtype,
                 device: Any = "cuda"):
        rng = random.Random(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        n = batch * nodes
        local: list[int] = []
        for _ in range(batch):
            local.extend(tree_parents("random", nodes, rng))
        self.parents = torch.tensor(local, dtype=torch.int32, device=device)
        self.cu = torch.arange(0, n + 1, nodes, dtype=torch.int32, device=device)

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device)

        self.x = randn(n, dim).to(act_dtype)
        self.conv_state = randn(batch + 1, dim, width - 1).to(act_dtype)
        self.weight = randn(dim, width).to(act_dtype)
        self.bias = randn(dim).to(act_dtype)
        self.slots = torch.randperm(batch + 1, generator=gen, device=device)[:batch].to(torch.int32)
        self.accepted = torch.tensor([rng.randint(0, nodes - 1) for _ in range(batch)],
                                     dtype=torch.int32, device=device)


# ---- timing -------------------------------------------------------------------------------

def capture(torch, fn: Callable[[], Any], *, warmup: int = 2, pool=None) -> tuple[Any, Any]:
    """fn() run `warmup` times eagerly on a side stream (Triton compiles there), then captured
    in a CUDA graph: (graph, the captured output, whose tensors replays overwrite)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = fn()
    return graph, output


def capture_graph(torch, fns: list[Callable[[], Any]]):
    """One CUDA graph running every fn in order (two eager warm-up passes first)."""
    graph, _ = capture(torch, lambda: [fn() for fn in fns])
    torch.cuda.synchronize()
    return graph


def replay_ms(graph, rep_ms: float, warmup_ms: float) -> float:
    """Median milliseconds per replay of a captured graph (triton.testing.do_bench)."""
    import triton.testing

    return float(triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def time_graph(torch, fns: list[Callable[[], Any]], rep_ms: int = 200, calls: Optional[int] = None) -> float:
    """Microseconds per call: capture all fns in one CUDA graph; `calls` is how many
    logical calls they make (default: one per fn, i.e. one per input set)."""
    ms = replay_ms(capture_graph(torch, fns), rep_ms, warmup_ms=100)
    return ms * 1e3 / (calls or len(fns))


class CudaGraphTimer:
    """capture(fns) -> graph; measure(graph, rep_ms, warmup_ms) -> ms per replay. Keeping
    the graph lets a quick timing and a full timing of one config share one capture."""

    def __init__(self, torch):
        self.torch = torch

    def capture(self, fns: list[Callable[[], Any]]):
        return capture_graph(self.torch, fns)

    def measure(self, graph, rep_ms: float, warmup_ms: float) -> float:
        return replay_ms(graph, rep_ms, warmup_ms)


def seconds_per_call(torch, run: Callable[[], Any], calls: int, *, cuda: bool) -> float:
    """Mean seconds of `calls` back-to-back runs: CUDA events around them on a GPU, the
    wall clock otherwise."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - t0) / calls


def warm_gpu(torch, seconds: float = 1.0) -> None:
    """Run matmuls until the clocks have ramped up (an idle H200 sits at ~500 MHz)."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()


def measure_copy_bandwidth(torch) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second)."""
    import triton.testing

    n = GiB
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")  # random, never zeros
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)
