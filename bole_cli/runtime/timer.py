"""Timing of the complete hybrid forward for the calibration sweep (calibrate.sweep.StepTimer).

    timer = HybridForwardTimer(spec, "cuda", torch.bfloat16)            # whole model
    timer = HybridForwardTimer(spec, "cuda", torch.bfloat16, layers_sample=2)
    timer.time_decode(batch=8, kv_len=4096)            # seconds of one decode step
    timer.time_verify(batch=8, kv_len=4096, n_tree_tokens=128)  # verify + commit

Each call times one step (CUDA events around `inner` CUDA-graph replays, averaged, by
bole_cli.timing.seconds_per_call; the sweep driver does warm-up, repeats and the median;
docs/design.md §8). Shapes are prepared lazily: the
first call of a shape allocates, warms up (Triton autotune) and captures its graph.
Data is random and non-zero: weights, KV cache, GDN states, conv windows, tokens; trees
come from bole_cli.trees.random_tree (single root = the last verified token, depth <= 8),
`n_tree_tokens` spread evenly over the batch, and the commit accepts each request's
deepest node.

Memory is estimated before anything is allocated (`estimate_memory`: weights + KV +
states + the verify's transient buffers + activations + a fixed workspace) and compared
with torch.cuda.mem_get_info. A model that does not fit raises BoleError with what it
needs; `layers_sample=K` instead builds K blocks of four layers (three GDN, one
attention) with the full embedding and LM head, times them, times the head alone, and
scales the layers' share to the full depth (`info()["sampled"]`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from bole_cli.catalog.models import ModelSpec
from bole_cli.errors import BoleError, InputError
from bole_cli.footprint import does_not_fit, step_memory
from bole_cli.runtime.gdn_ops import factor_dtype
from bole_cli.runtime.graphs import try_capture
from bole_cli.runtime.model import HybridModel
from bole_cli.runtime.tree_metadata import DecodeInputs, TreeInputs, refill_decode, refill_tree
from bole_cli.timing import seconds_per_call

SAMPLE_BLOCK = 4  # layers per sampled block: 3 GDN + 1 full attention


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def tree_sizes(batch: int, n_tree_tokens: int) -> list[int]:
    """n_tree_tokens spread over the batch as evenly as possible (earlier requests +1)."""
    if batch < 1 or n_tree_tokens < batch:
        raise InputError(f"n_tree_tokens={n_tree_tokens} must be at least batch={batch} "
                         "(every request verifies at least its root)")
    q, r = divmod(n_tree_tokens, batch)
    return [q + (b < r) for b in range(batch)]


def estimate_memory(spec: ModelSpec, dtype: torch.dtype, *, batch: int, kv_len: int,
                    n_tree_tokens: int = 0, path: str = "bole") -> dict[str, int]:
    """Bytes the runtime allocates for one step in `dtype` (bole_cli.footprint.step_memory)."""
    return step_memory(spec, _elem(dtype), _elem(factor_dtype(dtype)), batch=batch, kv_len=kv_len,
                       n_tree_tokens=n_tree_tokens, path=path)


def sampled_spec(spec: ModelSpec, blocks: int) -> ModelSpec:
    """`blocks` four-layer blocks (GDN, GDN, GDN, attention) of `spec`, full embedding/head."""
    if not isinstance(blocks, int) or blocks < 1:
        raise InputError(f"layers_sample must be a positive integer (blocks of {SAMPLE_BLOCK} layers), got {blocks!r}")
    return dataclasses.replace(spec, layers=SAMPLE_BLOCK * blocks, full_attention_interval=SAMPLE_BLOCK,
                               full_attention_layers=None)


class HybridForwardTimer:
    """calibrate.sweep.StepTimer over HybridModel on one device.

    path: GDN verify engine, "bole" (closed form + replay commit) or "snapshot"
    (baseline). inner: replays averaged per call. use_graphs: default True on CUDA.
    serving_step: time a step as a serving loop runs it (what `bole calibrate` decides
    with, docs/design.md §8): between host syncs, the step's inputs (tokens, parents,
    committed lengths) checked and copied in one transfer, then one graph replay that
    derives the metadata on the device (runtime.tree_metadata), runs the forward and a
    verify's commit, by the wall clock; otherwise back-to-back replays of forward + device
    commit under CUDA events.
    free_bytes: memory budget override (default: torch.cuda.mem_get_info on CUDA; no
    check on CPU). Other keyword arguments go to HybridModel (gdn_backend, gdn_decode,
    snapshot, seed).
    """

    def __init__(self, spec: ModelSpec, device="cuda", dtype: torch.dtype = torch.bfloat16,
                 layers_sample: Optional[int] = None, *, path: str = "bole", inner: int = 3,
                 use_graphs: Optional[bool] = None, free_bytes: Optional[int] = None,
                 max_depth: int = 8, serving_step: bool = False, **model_kw):
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.path = path
        self.inner = max(1, int(inner))
        self.max_depth = max_depth
        self.serving_step = serving_step
        self.layers_sample = layers_sample
        self.timed_spec = spec if layers_sample is None else sampled_spec(spec, layers_sample)
        self._free_override = free_bytes
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.eager_reason = "" if self.use_graphs else "CUDA graphs off (CPU or use_graphs=False)"
        self._require(estimate_memory(self.timed_spec, dtype, batch=1, kv_len=1), "the weights")
        self.model = HybridModel(self.timed_spec, self.device, dtype, **model_kw)
        self.device_name = (torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu")
        self._cache = None
        self._steps: dict[tuple, Any] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._captured = False

    # ---- memory ---------------------------------------------------------------------
    def _free(self) -> Optional[int]:
        if self._free_override is not None:
            return self._free_override
        if self.device.type != "cuda":
            return None
        return torch.cuda.mem_get_info(self.device)[0]

    def _require(self, est: dict[str, int], what: str, *, held: int = 0) -> None:
        """held: bytes already allocated that the estimate counts (weights, the cache to be freed)."""
        free = self._free()
        if free is None or est["total"] <= free + held:
            return
        hint = ("" if self.layers_sample is not None else
                f"; time a sample instead with layers_sample=K (K blocks of {SAMPLE_BLOCK} layers)")
        raise does_not_fit(self.timed_spec.name, what, est, free + held, str(self.device), hint)

    def _cache_for(self, batch: int, need_len: int, kv_len: int, n_tree_tokens: int = 0):
        c = self._cache
        if c is None or c.n_slots < batch or c.max_len < need_len:
            est = estimate_memory(self.timed_spec, self.dtype, batch=batch, kv_len=kv_len,
                                  n_tree_tokens=n_tree_tokens, path=self.path)
            held = self.model.param_bytes + (c.nbytes if c is not None else 0)
            what = f"batch {batch}, kv_len {kv_len}" + (f", {n_tree_tokens} tree tokens" if n_tree_tokens else "")
            self._require(est, what, held=held)
            slots = max(batch, c.n_slots if c is not None else 0)
            max_len = max(-(-need_len // 256) * 256, c.max_len if c is not None else 0)
            self._cache = c = None
            self.reset_graphs()  # graphs and metadata of the old cache
            self._cache = self.model.new_cache(slots, max_len, random_fill=True)
        for s in range(self._cache.n_slots):
            self._cache.kv_lens[s] = kv_len
        return self._cache

    def reset_graphs(self) -> None:
        """Drop the captured steps and their metadata; later captures go to a fresh memory pool
        (a pool whose graphs were all freed must not be captured into again: the CUDA
        allocator asserts, R-10)."""
        self._steps.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            if self.use_graphs:
                self._pool = torch.cuda.graph_pool_handle()

    # ---- timing -----------------------------------------------------------------------
    def _time(self, key: tuple, fn) -> float:
        run = self._steps.get(key)
        if run is None:
            run = fn
            if self.use_graphs:
                step, why = try_capture(fn, warmup=2, pool=self._pool)
                if step is not None:
                    run = step.replay
                    self._captured = True
                elif self._captured:  # graphed and eager points in one profile would not compare
                    raise BoleError(f"CUDA graph capture failed for {key[:-1]} after earlier steps were "
                                    f"captured ({why}); time with use_graphs=False")
                else:
                    self.use_graphs, self.eager_reason = False, why
            for _ in range(2):
                run()
            self._steps[key] = run
        return seconds_per_call(torch, run, self.inner, cuda=self.device.type == "cuda")

    def _scaled(self, key: tuple, make_fn) -> float:
        """Whole model, or (sampled) head + layers' share scaled to the full depth."""
        with torch.inference_mode():
            t = self._time(key + ("all",), make_fn(None))
            if self.layers_sample is None:
                return t
            head = self._time(key + ("head",), make_fn([]))
        return head + (t - head) * self.spec.layers / self.timed_spec.layers

    def time_decode(self, batch: int, kv_len: int) -> float:
        """Seconds of one decode step: `batch` requests, one token each, over kv_len cached tokens."""
        cache = self._cache_for(batch, kv_len + 1, kv_len)
        key = ("decode", batch, kv_len)
        db = self._prepared(key, lambda: self.model.prepare_decode(
            cache, self._tokens(batch, seed=kv_len), list(range(batch))))

        def make(layers):
            def step():  # returns nothing: a graph keeps no output alive, so captures share memory
                self.model.forward_decode(cache, db, layers)
            return step

        if self.serving_step and self.layers_sample is None:
            inputs = self._prepared(key + ("inputs",), lambda: DecodeInputs(db))
            tokens, base = self._tokens(batch, seed=kv_len).tolist(), [kv_len] * batch

            def forward():
                refill_decode(db, inputs.tokens, inputs.base, self.model.rope)
                self.model.forward_decode(cache, db)

            return self._serving(key, forward, lambda: inputs.load(tokens, base))
        return self._scaled(key, make)

    def time_verify(self, batch: int, kv_len: int, n_tree_tokens: int) -> float:
        """Seconds of one tree verify (n_tree_tokens over the batch) plus its commit."""
        from bole_cli.limits import MAX_TREE_NODES
        from bole_cli.trees import pack_forest, random_tree

        sizes = tree_sizes(batch, n_tree_tokens)
        if sizes[0] > MAX_TREE_NODES:
            raise InputError(f"{n_tree_tokens} tree tokens over batch {batch} gives {sizes[0]}-node trees; "
                             f"a request's tree holds at most {MAX_TREE_NODES} (the kernels' limit)")
        cache = self._cache_for(batch, kv_len + sizes[0], kv_len, n_tree_tokens)
        key = ("verify", self.path, batch, kv_len, n_tree_tokens)

        def prepare():
            trees = [random_tree(1000 * n_tree_tokens + b, n, self.max_depth) for b, n in enumerate(sizes)]
            forest = pack_forest(trees)
            self._steps[("prepared-trees",) + key] = (trees, forest)
            tb = self.model.prepare_verify(cache, forest, self._tokens(n_tree_tokens, seed=n_tree_tokens),
                                           list(range(batch)))
            deepest = [max(range(t.n_nodes), key=lambda i: t.depths[i]) for t in trees]
            return tb, torch.tensor(deepest, dtype=torch.int64, device=self.device)

        tb, accepted = self._prepared(key, prepare)

        def make(layers):  # layers=[] is the sampled head alone: no GDN layer, no commit
            def step():
                out = self.model.forward_verify(cache, tb, path=self.path, layers=layers)
                if layers is None:
                    self.model.commit_device(cache, out, accepted)
            return step

        if self.serving_step and self.layers_sample is None:
            trees, forest = self._steps[("prepared-trees",) + key]
            inputs = self._prepared(key + ("inputs",), lambda: TreeInputs(tb))
            parents = [int(p) for p in forest.parents]
            tokens, base = self._tokens(n_tree_tokens, seed=n_tree_tokens).tolist(), [kv_len] * batch

            def forward():  # metadata, forward and commit: one graph, as a production step
                refill_tree(tb, inputs.parents, inputs.tokens, inputs.base, self.model.rope)
                self.model.commit_device(cache, self.model.forward_verify(cache, tb, path=self.path), accepted)

            return self._serving(key + ("serving",), forward, lambda: inputs.load(parents, tokens, base))
        return self._scaled(key, make)

    def _serving(self, key: tuple, forward, prepare, finish=None) -> float:
        """Wall seconds of prepare (host: the step's inputs checked, packed and copied) +
        forward (graph replay: metadata derived on the device, forward, commit) + finish
        (eager), each call between syncs: one step of a serving loop (serving_step)."""
        import time

        with torch.inference_mode():
            # the first call's closures stay (the graph captured their buffers)
            if key not in self._steps:
                run = forward
                prepare()  # the warm-up and the capture read real inputs
                if self.use_graphs:
                    step, why = try_capture(forward, warmup=2, pool=self._pool)
                    if step is not None:
                        run, self._captured = step.replay, True
                    else:
                        self.use_graphs, self.eager_reason = False, why
                self._steps[key] = (run, prepare, finish)
            run, prepare, finish = self._steps[key]
            total = 0.0
            for _ in range(self.inner):
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                prepare()
                run()
                if finish is not None:
                    finish()
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                total += time.perf_counter() - t0
            return total / self.inner

    def _prepared(self, key: tuple, build):
        """Prepared metadata per shape, kept alive with its graphs (static inputs)."""
        k = ("prepared",) + key
        if k not in self._steps:
            self._steps[k] = build()
        return self._steps[k]

    def _tokens(self, n: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(self.spec.vocab, (n,), generator=gen)

    def info(self) -> dict[str, Any]:
        from bole_cli.kernels.cache_attention import LAUNCH_RULE

        m = self.model
        return {"runtime": "bole_cli.runtime", "model": self.spec.name, "dtype": str(self.dtype).replace("torch.", ""),
                "device": self.device_name, "path": self.path, "gdn_ops": m.ops.describe(),
                "step_timing": ("serving step (inputs checked and copied once from the host; "
                                "metadata, forward and commit replayed as one CUDA graph; "
                                "between syncs; wall clock)"
                                if self.serving_step and self.layers_sample is None else
                                "back-to-back graph replays of forward + device commit"),
                "gdn_decode": m.gdn_decode, "skinny_mm": list(m.skinny_mm),
                "skinny_max_rows": m.skinny_max_rows if m.skinny_mm else None,
                "attention_in_kernel": m.attention_in_kernel,
                "cache_attention_launch_rule": LAUNCH_RULE if m.cache_kernel else None,
                "moe_grouped_mm": m.grouped_mm if self.spec.is_moe else None,
                "cuda_graphs": self.use_graphs, "eager_reason": self.eager_reason or None,
                "sampled": self.layers_sample is not None,
                "sampled_layers": (list(range(self.timed_spec.layers)) if self.layers_sample is not None else None),
                "timed_layers": self.timed_spec.layers, "model_layers": self.spec.layers,
                "weights_bytes": m.param_bytes}
