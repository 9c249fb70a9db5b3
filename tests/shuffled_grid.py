"""Triton's interpreter runs a grid's programs in order, innermost dimension first, so a kernel
whose programs meet through memory (a last-to-arrive counter) always sees the same arrival
order on the CPU. `shuffled_grid()` runs every grid of the block in a random order of its
programs instead (a fixed permutation a grid shape), so a wrong index into the shared buffers
or the counters shows up as wrong results here rather than only on the GPU."""

from __future__ import annotations

import contextlib
import random


@contextlib.contextmanager
def shuffled_grid(seed: int = 0):
    import triton.runtime.interpreter as interp

    builder = interp.InterpreterBuilder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    orders: dict[tuple, list] = {}

    def shuffled_idx(self, x, y, z):
        nx, ny, nz = self.grid_dim
        order = orders.get(self.grid_dim)
        if order is None:
            order = orders[self.grid_dim] = [(a, b, c) for a in range(nx) for b in range(ny) for c in range(nz)]
            random.Random(seed).shuffle(order)
        set_idx(self, *order[(x * ny + y) * nz + z])

    builder.set_grid_idx = shuffled_idx
    try:
        yield
    finally:
        builder.set_grid_dim, builder.set_grid_idx = set_dim, set_idx
