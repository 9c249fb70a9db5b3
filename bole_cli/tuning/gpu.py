"""The GPU side of the search: inputs, the correctness gate and CUDA-graph timing.

Inputs and timing are `bole bench kernels`' (bole_cli.timing): `LayerInputs` builds one
GDN layer's realistic verify inputs per (batch, nodes) (random trees of depth <= 8, bf16
activations, float32 state pool; here without SGLang's buffers); ROTATE such sets are
timed together so repeated replays do not measure the L2 cache, and do_bench flushes the
L2 between replays. `CudaGraphTimer` keeps the captured graph, so a config's quick timing
(pruning) and full timing share one capture, and the warm-up is short (`warm_gpu` ramps
the clocks once, the search keeps them busy).

What is timed per kernel (one launch per input set):
  tree_verify  tree_verify_gated (gates fused, as the runtime calls it) as served: without
               the factors (factors=False); the plug-in's ungated launch takes the same
               config (its gates loaded instead of computed; the gate checks both)
  tree_commit_replay  tree_commit_replay_gated of one layer of batch x layers requests (the
               served launch's programs, bole_cli.tuning.plan), the tree size and depth
               promised as the runtime promises them
  tree_commit  tree_commit of a single layer (the factors of a real verify; the tables
               baseline of `bole bench kernels`, no longer served)
  tree_conv    tree_conv then tree_conv_commit (the "tree_conv" config drives both)

Up to ROTATE sets: a set is built only while the GPU has room for two more of it (a replay
commit's bucket at batch x layers holds gigabytes a set: 27B at batch 64 and 256 nodes, 3072
request-layers, ~26 GB), and one always. `make_layer_inputs`, `timer` and `memory` (bytes
allocated, bytes free) are injectable so the tests drive this class on the CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Optional

from bole_cli.timing import ROTATE, ConvInputs, CudaGraphTimer, LayerInputs
from bole_cli.tuning.checks import (Verdict, build_check_case, check_sizes, commit_promise, run_check, tolerance,
                                    verify_path_kwargs)

if TYPE_CHECKING:  # bole_cli.kernels loads torch and triton: imported where used
    from bole_cli.kernels.buckets import Bucket


class GpuEvaluator:
    """Evaluator (bole_cli.tuning.study) on a CUDA device."""

    def __init__(self, *, device: Any = "cuda", act_dtype: str = "bfloat16", state_dtype: str = "float32",
                 rotate: Optional[int] = None, warmup_ms: float = 10.0, seed: int = 0,
                 make_layer_inputs: Optional[Callable] = None, timer: Any = None, kernels_mod: Any = None,
                 device_name: Optional[str] = None, memory: Optional[Callable[[], tuple[int, int]]] = None):
        import torch
        import triton

        if kernels_mod is None:
            from bole_cli import kernels as kernels_mod
        self.torch, self.kernels, self.device = torch, kernels_mod, device
        self.act = getattr(torch, act_dtype)
        self.state_dtype = getattr(torch, state_dtype)
        self.rotate = rotate or ROTATE
        self.warmup_ms = warmup_ms
        self.seed = seed
        self.make_layer_inputs = make_layer_inputs or LayerInputs.for_dims
        self.timer = timer or CudaGraphTimer(torch)
        if memory is None:  # off CUDA (the tests' interpreter runs) nothing limits the sets
            def memory():
                if str(device).startswith("cuda"):
                    return torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
                return 0, float("inf")
        self.memory = memory
        self.device_name = device_name or (torch.cuda.get_device_name() if str(device).startswith("cuda") else str(device))
        self.triton_version = triton.__version__
        self.tol = tolerance(self.act)
        self._cases: dict[tuple, dict] = {}
        self._bucket: Optional[Bucket] = None
        self._sets: list = []
        self._outs: list = []
        self._graphs: "OrderedDict[tuple, Any]" = OrderedDict()

    # -- Evaluator protocol ------------------------------------------------------------
    def default_config(self, bucket: Bucket) -> dict:
        from bole_cli.tuning.study import builtin_default

        return builtin_default(bucket)

    def prepare(self, bucket: Bucket) -> None:
        from bole_cli.kernels.types import VerifyResult

        torch = self.torch
        self.release()
        self._bucket = bucket
        dims = bucket.dims
        nodes = bucket.nodes if bucket.nodes is not None else 64  # Eq. 10's commit: a depth-8 tree of 64
        sets, outs = [], []
        set_bytes = 0
        for i in range(self.rotate):
            allocated, free = self.memory()
            if i and free < 2 * set_bytes:
                break  # no room for another set and the graph's own buffers: time fewer sets
            seed = self.seed * 7919 + 1000 * i + 7 * bucket.batch + nodes
            if bucket.kernel == "tree_conv":
                sets.append(ConvInputs(torch, dims["D"], dims["W"], bucket.batch, nodes, seed, self.act, self.device))
            else:
                s = self.make_layer_inputs(torch, dims, bucket.batch, nodes, seed, self.act, self.state_dtype)
                # the verify's outputs where a timed launch writes or reads them (the replay: neither)
                out = VerifyResult.like(s.v) if bucket.kernel in ("tree_verify", "tree_commit") else None
                if bucket.kernel == "tree_commit":  # real factors for the commit to consume
                    self.kernels.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                                   s.parents, s.cu, check_trees=False, out=out)
                sets.append(s)
                outs.append(out)
            set_bytes = max(set_bytes, self.memory()[0] - allocated)
        self._sets, self._outs = sets, outs

    def check(self, bucket: Bucket, config: dict) -> Verdict:
        sizes = check_sizes(bucket.kernel, config, bucket.nodes)
        key = (bucket.kernel, bucket.model, sizes)
        case = self._cases.get(key)
        if case is None:
            case = self._cases[key] = build_check_case(bucket.kernel, bucket.dims, self.device,
                                                       act_dtype=self.act, seed=self.seed, sizes=sizes)
        return run_check(bucket.kernel, case, config, kernels_mod=self.kernels, tol=self.tol)

    def closures(self, bucket: Bucket, config: dict) -> list[Callable[[], Any]]:
        """One closure per input set, launching the bucket's kernel with `config`."""
        k, cfg = self.kernels, dict(config)
        fns: list[Callable[[], Any]] = []
        for i, s in enumerate(self._sets):
            if bucket.kernel == "tree_verify":
                out = self._outs[i]

                # as the benches and the runtime launch it: sizes and depth promised
                path = dict(verify_path_kwargs(cfg, int(bucket.nodes or 1)), max_depth=getattr(s, "max_depth", None))

                def fn(s=s, out=out, path=path):
                    k.tree_verify_gated(s.q, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.pool, s.slots,
                                        s.parents, s.cu, out=out, config=cfg, factors=False, **path)
            elif bucket.kernel == "tree_commit_replay":
                walk = commit_promise(s.nodes)  # the set's size (a bucket may name none): the gate's promises

                def fn(s=s, walk=walk):
                    k.tree_commit_replay_gated(s.pool, s.slots, s.k, s.v, s.a, s.b, s.A_log, s.dt_bias, s.parents,
                                               s.cu, s.accepted, check_trees=False, config=cfg, **walk)
            elif bucket.kernel == "tree_commit":
                out = self._outs[i]

                def fn(s=s, out=out):
                    k.tree_commit(s.pool, s.slots, s.k, out.u, out.log_p, s.parents, s.cu, s.accepted,
                                  check_trees=False, config=cfg)
            else:
                def fn(s=s):
                    k.tree_conv(s.x, s.conv_state, s.weight, s.bias, s.slots, s.parents, s.cu,
                                check_trees=False, config=cfg)
                    k.tree_conv_commit(s.conv_state, s.x, s.slots, s.parents, s.cu, s.accepted,
                                       check_trees=False, config=cfg)
            fns.append(fn)
        return fns

    def time(self, bucket: Bucket, config: dict, rep_ms: float) -> float:
        """Microseconds per launch (per input set) of `config` on the prepared inputs."""
        if bucket != self._bucket:
            self.prepare(bucket)
        key = tuple(sorted(config.items()))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self.timer.capture(self.closures(bucket, config))
            self._graphs[key] = graph
            while len(self._graphs) > 2:  # the best and the default alternate in `confirm`
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        ms = self.timer.measure(graph, rep_ms, self.warmup_ms)
        return ms * 1e3 / max(len(self._sets), 1)

    def release(self) -> None:
        self._graphs.clear()
        self._sets, self._outs, self._bucket = [], [], None
        if str(self.device).startswith("cuda"):
            self.torch.cuda.empty_cache()


def dry_run_checks(kernels_and_configs: list[tuple[str, dict]], *, device: Any = "cpu", seed: int = 0,
                   tiny: Optional[dict] = None) -> list[dict]:
    """Check configs on a tiny shape (Triton's interpreter on a CPU): the dry run's sample.

    tiny: model dims per kernel; default H1 HV2 K32 V32 (GQA group 2) and D128 W4, float32
    activations (tolerance 2e-3).
    """
    import torch

    tiny = tiny or {"tree_verify": {"H": 1, "HV": 2, "K": 32, "V": 32},
                    "tree_commit_replay": {"H": 1, "HV": 2, "K": 32, "V": 32},
                    "tree_commit": {"H": 1, "HV": 2, "K": 32, "V": 32},
                    "tree_conv": {"D": 128, "W": 4}}
    cases: dict[tuple, dict] = {}
    out = []
    for kernel, cfg in kernels_and_configs:
        sizes = check_sizes(kernel, cfg, 40)  # small: the interpreter is slow
        if (kernel, sizes) not in cases:
            cases[(kernel, sizes)] = build_check_case(kernel, tiny[kernel], device, act_dtype=torch.float32,
                                                      seed=seed, sizes=sizes)
        v = run_check(kernel, cases[(kernel, sizes)], cfg)
        out.append({"kernel": kernel, "config": dict(cfg), "shape": dict(tiny[kernel]), **v.to_dict()})
    return out
