"""Programmatic dependent launch (PDL, Hopper and later): a step's next kernel launched while
the one before it on the stream is still finishing, so its launch and its programs' start
overlap that kernel's tail instead of following it.

Why: a one-row decode is some 280-350 short kernels back to back, and a graph replay pays
about 0.5 us a kernel between them beyond the kernels' own time, plus each kernel's ramp
(experiments/NOTES.md "The one-row projections and dependent launch"). A kernel launched
this way must wait (griddepcontrol.wait) before it touches memory an earlier kernel may
read or write: `wait_for_prior` does, first thing, and then lets the next kernel launch
(griddepcontrol.launch_dependents) once every program of this one has started. Only reads
of what no kernel of the step writes (the weights) may come before it.

`ENABLED` is the default: off until a device measurement says otherwise (runtime_step_bench's
`pdl` variant sets it). CPU tensors and GPUs before Hopper never take it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

ENABLED = False
MIN_CAPABILITY = 9  # griddepcontrol: sm_90 and later


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= MIN_CAPABILITY


def use_pdl(t: torch.Tensor) -> bool:
    """Whether a kernel over `t`'s device launches dependent (the PDL constexpr and Triton's
    launch_pdl option, always together: a kernel launched dependent must wait)."""
    return ENABLED and t.is_cuda and _capable(t.device.index if t.device.index is not None
                                              else torch.cuda.current_device())


def launch_options(t: torch.Tensor) -> dict:
    """The kernel's PDL constexpr and, when on, Triton's launch option for it."""
    on = use_pdl(t)
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def wait_for_prior(PDL: tl.constexpr):
    """Under PDL: wait until the kernels before this one on the stream are done and their
    writes visible, then let the next kernel launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
