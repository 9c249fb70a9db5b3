"""CUDA graphs for the runtime's steps, one per shape bucket, as a serving engine runs them.

A bucket is a prepared batch's `signature()` (batch size, node count, padded tree size,
KV read length, ...). The first step of a bucket is warmed up eagerly (Triton compiles
and autotunes there), captured, and its prepared tensors become the graph's static
inputs; later steps of the bucket copy their metadata into them and replay. On CPU, or
when capture fails (an op that synchronises with the host, such as the float64
reference GDN ops), steps run eagerly and `GraphedRunner.eager_reason` says why.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from bole_cli.runtime.model import HybridCache, HybridModel, VerifyOutput


class CapturedStep:
    """fn() warmed up on a side stream, then captured; replay() reruns it, returning the
    captured (static) outputs."""

    def __init__(self, fn: Callable[[], Any], *, warmup: int = 2, pool=None):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = fn()

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
        self.enabled = model.device.type == "cuda" if enabled is None else enabled
        self.warmup = warmup
        self.eager_reason = "" if self.enabled else "CUDA graphs need a CUDA device"
        self._steps: dict[tuple, tuple[CapturedStep, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.enabled else None

    def _replay(self, key: tuple, prepared, fn: Callable[[Any], Any], restore_slots: bool) -> Any:
        if not self.enabled:
            return fn(prepared)
        entry = self._steps.get(key)
        if entry is None:
            saved = None
            if restore_slots:
                c = self.cache
                saved = (c.gdn_state[:, prepared.slots].clone(), c.conv_state[:, prepared.slots].clone())
            step, why = try_capture(lambda: fn(prepared), warmup=self.warmup, pool=self._pool)
            if saved is not None:
                self.cache.gdn_state[:, prepared.slots] = saved[0]
                self.cache.conv_state[:, prepared.slots] = saved[1]
            if step is None:
                self.enabled, self.eager_reason = False, why
                return fn(prepared)
            entry = self._steps[key] = (step, prepared)
        else:
            entry[1].copy_from(prepared)
        return entry[0].replay()

    @torch.inference_mode()
    def decode(self, tokens, slots: Optional[Sequence[int]] = None) -> torch.Tensor:
        slots = list(range(len(tokens))) if slots is None else [int(x) for x in slots]
        db = self.model.prepare_decode(self.cache, tokens, slots, kv_bucket=self.kv_bucket)
        logits = self._replay(("decode",) + db.signature(), db,
                              lambda p: self.model.forward_decode(self.cache, p), True)
        for s in slots:
            self.cache.kv_lens[s] += 1
        return logits

    @torch.inference_mode()
    def verify(self, forest, tokens, slots: Optional[Sequence[int]] = None, *, path: str = "bole") -> VerifyOutput:
        tb = self.model.prepare_verify(self.cache, forest, tokens, slots, kv_bucket=self.kv_bucket)
        return self._replay(("verify", path) + tb.signature(), tb,
                            lambda p: self.model.forward_verify(self.cache, p, path=path), False)

    def commit(self, out: VerifyOutput, accepted) -> None:
        self.model.commit(self.cache, out, accepted)
