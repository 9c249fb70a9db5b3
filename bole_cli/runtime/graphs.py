"""CUDA graphs for the runtime's steps, one per shape bucket, as a serving engine runs them.

A bucket is a prepared batch's `signature()` (batch size, node count, padded tree size,
KV read length, ...). The first step of a bucket is warmed up eagerly (Triton compiles
and autotunes there), captured, and its prepared tensors become the graph's static
inputs; later steps of the bucket copy their metadata into them and replay. On CPU, or
when capture fails (an op that synchronises with the host, such as the float64
reference GDN ops), steps run eagerly and `GraphCache.reason` says why.

`GraphCache` is the one cache of captured steps: the decoders of `bole bench e2e`
(bole_cli/bench/e2e/decoders.py) replay through it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

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
