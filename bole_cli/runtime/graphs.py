"""CUDA graphs for the runtime's steps, one per shape bucket, as a serving engine runs them.

A bucket is a prepared batch's `signature()` (batch size, node count, padded tree size,
KV read length, ...). The first step of a bucket is warmed up eagerly (Triton compiles
and autotunes there), captured, and its prepared tensors become the graph's static
inputs; later steps of the bucket copy their metadata into them and replay. On CPU, or
when capture fails (an op that synchronises with the host, such as the float64
reference GDN ops), steps run eagerly and `GraphCache.reason` says why.

`GraphCache` is the one cache of captured steps: GraphedRunner (below) and the decoders
of `bole bench e2e` (bole_cli/bench/e2e/decoders.py) both replay through it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from bole_cli.runtime.model import HybridCache, HybridModel, VerifyOutput
from bole_cli.timing import capture


class CapturedStep:
    """fn() warmed up on a side stream, then captured; replay() reruns it, returning the
    captured (static) outputs."""

    def __init__(self, fn: Callable[[], Any], *, warmup: int = 2, pool=None):
        self.graph, self.output = capture(torch, fn, warmup=warmup, pool=pool)

    def replay(self) -> Any:
        self.graph.replay()
        return self.output


def try_capture(fn: Callable[[], Any], *, warmup: int = 2, pool=None) -> tuple[Optional[CapturedStep], str]:
    """(CapturedStep, "") or (None, why) when the step cannot be captured."""
    try:
        return CapturedStep(fn, warmup=warmup, pool=pool), ""
    except Exception as exc:  # noqa: BLE001 - any capture failure means "run eagerly"
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {exc}"


class GraphCache:
    """One CUDA graph per key (a step kind plus its bucket's signature). The first call of
    a key warms up and captures `fn(prepared)`, whose `prepared` becomes the graph's static
    input; later calls copy their `prepared` into it (`copy_from`) and replay. `save`, for
    steps whose warm-up mutates state (a decode advancing the GDN states), is called before
    the capture and returns the callable that restores that state after it. The first
    capture failure turns the cache off: every later call runs eagerly, `reason` says why."""

    def __init__(self, enabled: bool, *, warmup: int = 2, reason: str = "CUDA graphs off"):
        self.enabled = enabled
        self.reason = "" if enabled else reason
        self.warmup = warmup
        self._steps: dict[tuple, tuple[CapturedStep, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if enabled else None

    def run(self, key: tuple, prepared, fn: Callable[[Any], Any],
            save: Optional[Callable[[], Callable[[], None]]] = None) -> Any:
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
        """Drop the captured graphs (their static buffers go with them)."""
        self._steps.clear()


class GraphedRunner:
    """decode / verify / commit like HybridModel's, replaying a CUDA graph per bucket.

    kv_bucket rounds the attention's KV read length up (masked), so one graph serves
    `kv_bucket` consecutive decode steps. Outputs are the graph's static tensors: use
    (or clone) them before the next step of the same bucket; commit a verify before the
    next verify. Warm-up runs before capture would advance the GDN states of a decode;
    the touched slots are restored afterwards.
    """

    def __init__(self, model: HybridModel, cache: HybridCache, *, kv_bucket: int = 256,
                 enabled: Optional[bool] = None, warmup: int = 2):
        self.model, self.cache = model, cache
        self.kv_bucket = kv_bucket
        self.graphs = GraphCache(model.device.type == "cuda" if enabled is None else enabled, warmup=warmup,
                                 reason="CUDA graphs need a CUDA device")

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    @property
    def eager_reason(self) -> str:
        return self.graphs.reason

    def _save_slots(self, slots: Sequence[int]) -> Callable[[], None]:
        """The slots' per-step state (GDN states, pending rows of deferred commits, conv
        windows), put back after a capture's warm-up runs advanced it."""
        c = self.cache
        tensors = [c.gdn_state, c.conv_state, *(c.gdn_pending or ())]
        saved = [t[:, slots].clone() for t in tensors]

        def restore() -> None:
            for t, old in zip(tensors, saved):
                t[:, slots] = old
        return restore

    @torch.inference_mode()
    def decode(self, tokens, slots: Optional[Sequence[int]] = None) -> torch.Tensor:
        slots = list(range(len(tokens))) if slots is None else [int(x) for x in slots]
        db = self.model.prepare_decode(self.cache, tokens, slots, kv_bucket=self.kv_bucket)
        logits = self.graphs.run(("decode",) + db.signature(), db,
                                 lambda p: self.model.forward_decode(self.cache, p),
                                 save=lambda: self._save_slots(db.slots))
        for s in slots:
            self.cache.kv_lens[s] += 1
        return logits

    @torch.inference_mode()
    def verify(self, forest, tokens, slots: Optional[Sequence[int]] = None, *, path: str = "bole") -> VerifyOutput:
        tb = self.model.prepare_verify(self.cache, forest, tokens, slots, kv_bucket=self.kv_bucket)
        return self.graphs.run(("verify", path) + tb.signature(), tb,
                               lambda p: self.model.forward_verify(self.cache, p, path=path))

    def commit(self, out: VerifyOutput, accepted) -> None:
        self.model.commit(self.cache, out, accepted)
