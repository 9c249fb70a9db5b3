"""CUDA graphs for the runtime's steps, one per step kind and shape, as a serving engine runs them.

A step here reads and writes only device buffers of fixed addresses (its inputs are the
previous step's outputs, or static buffers it refills on the device: runtime/tree_metadata),
so a graph is captured once per key and replayed every step after. The first call of a key
runs the step eagerly, as a real step (Triton compiles and autotunes there, cuBLAS makes
its handles); the second captures it without further warm-up (the capture executes
nothing, so no step runs twice and no state needs saving) and replays it. On CPU, or when
capture fails (an op that synchronises with the host, such as the float64 reference GDN
ops), steps run eagerly and `GraphCache.reason` says why.

`GraphCache` is the one cache of captured steps: the decoders of `bole bench e2e`
(bole_cli/bench/e2e/decoders.py) replay through it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from bole_cli.timing import capture


class CapturedStep:
    """fn() warmed up on a side stream (`warmup` times), then captured; replay() reruns
    it, returning the captured (static) outputs."""

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
    """One CUDA graph per key (a step kind and its shape). `run(key, fn)`: the first call
    runs fn() eagerly; the second captures it (no warm-up: the first call was one) and
    replays; later calls replay. fn must keep its state on the device (a capture runs its
    Python once, replays do not). Graphs share one memory pool, replayed in capture order,
    so a graph may read an earlier one's outputs. The first capture failure turns the
    cache off: every later call runs eagerly, `reason` says why."""

    def __init__(self, enabled: bool, *, reason: str = "CUDA graphs off"):
        self.enabled = enabled
        self.reason = "" if enabled else reason
        self._steps: dict[tuple, Optional[CapturedStep]] = {}
        self._pool = torch.cuda.graph_pool_handle() if enabled else None

    def run(self, key: tuple, fn: Callable[[], Any]) -> Any:
        if not self.enabled:
            return fn()
        if key not in self._steps:
            self._steps[key] = None  # ran once, eagerly: capture on the next call
            return fn()
        step = self._steps[key]
        if step is None:
            step, why = try_capture(fn, warmup=0, pool=self._pool)
            if step is None:
                self.enabled, self.reason = False, why
                return fn()
            self._steps[key] = step
        return step.replay()

    def clear(self) -> None:
        """Drop the captured graphs (their static buffers go with them)."""
        self._steps.clear()
