"""Shape buckets: what a tuned launch configuration is keyed by, and the nearest-bucket
lookup the kernels use at launch (docs/design.md §3, §5).

A bucket is (kernel, the model's shape for that kernel, batch, tree nodes per request):

    tree_verify/H16-HV32-K128-V128/B4/N64     GDN key heads, value heads, key/value dims
    tree_commit_replay/H16-HV32-K128-V128/B96/N16  the served commit: its path walk is
                                              compiled for the promised tree size
    tree_commit/H16-HV32-K128-V128/B4         Eq. 10's commit walks only the accepted path,
                                              so its cost does not follow the tree size
    tree_conv/D8192-W4/B4/N64                 conv channels (q|k|v) and width

The lookup at run time (`nearest_bucket`) takes the kernel's `launch_config` shape dict:
the model shape must match exactly (H is compared only when the kernel passes it), else
the nearest value-head count with the same K and V (conv: nearest D with the same W) is
used; then the bucket nearest in log(batch) + log(nodes per request) wins, ties going to
the larger batch, then the larger tree. the commits' batch is B x L (a layered commit
launches the programs of L x B single-layer requests).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from bole_cli.errors import InputError
from bole_cli.kernels.verify_path import is_tile_launch

MODEL_DIMS: dict[str, tuple[str, ...]] = {
    "tree_verify": ("H", "HV", "K", "V"),
    "tree_commit_replay": ("H", "HV", "K", "V"),
    "tree_commit": ("H", "HV", "K", "V"),
    "tree_conv": ("D", "W"),
}
# Kernels whose cost follows the tree size (their buckets carry nodes per request).
BY_NODES = {"tree_verify": True, "tree_commit_replay": True, "tree_commit": False, "tree_conv": True}
# The commits: one launch may carry L layers, each request-layer a program, so their batch is B x L.
LAYERED = ("tree_commit_replay", "tree_commit")
# Launched over every GDN layer of a step at once (the runtime's and the plug-in's commit): tuned
# at batch x the model's GDN layers (bole_cli.tuning.plan).
ALL_LAYERS = ("tree_commit_replay",)


@dataclass(frozen=True, order=True)
class Bucket:
    kernel: str
    model: tuple[int, ...]  # values of MODEL_DIMS[kernel]
    batch: int
    nodes: Optional[int] = None  # per request; None where the cost does not follow it (BY_NODES)

    @property
    def dims(self) -> dict[str, int]:
        return dict(zip(MODEL_DIMS[self.kernel], self.model))

    @property
    def model_key(self) -> str:
        return "-".join(f"{k}{v}" for k, v in self.dims.items())

    @property
    def key(self) -> str:
        tail = f"/N{self.nodes}" if self.nodes is not None else ""
        return f"{self.kernel}/{self.model_key}/B{self.batch}{tail}"

    def launch_shape(self) -> dict[str, int]:
        """The shape dict the kernel passes to `launch_config` for this bucket."""
        d = self.dims
        if self.kernel == "tree_verify":  # T: the promised tree size (one-tile kernel up to 64)
            return {**d, "B": self.batch, "N": self.batch * int(self.nodes or 1), "T": int(self.nodes or 1)}
        shape = {**d, "B": self.batch, "L": 1} if self.kernel in LAYERED else {**d, "B": self.batch}
        if BY_NODES[self.kernel]:
            shape["N"] = self.batch * int(self.nodes or 1)
        return shape

    def describe(self) -> str:
        tail = f", {self.nodes} nodes" if self.nodes is not None else ""
        return f"{self.kernel} {self.model_key}, batch {self.batch}{tail}"


_KEY_RE = re.compile(r"^(?P<kernel>[a-z_]+)/(?P<model>[A-Za-z0-9-]+)/B(?P<batch>\d+)(?:/N(?P<nodes>\d+))?$")


def parse_bucket_key(key: str) -> Bucket:
    """Inverse of Bucket.key; InputError names the key when it is not one."""
    m = _KEY_RE.match(str(key))
    if not m or m["kernel"] not in MODEL_DIMS:
        raise InputError(f"{key!r}: not a bucket key (like tree_verify/H16-HV32-K128-V128/B4/N64)")
    kernel = m["kernel"]
    parts = dict(re.findall(r"([A-Z]+)(\d+)", m["model"]))
    names = MODEL_DIMS[kernel]
    if set(parts) != set(names) or "-".join(f"{n}{parts[n]}" for n in names) != m["model"]:
        raise InputError(f"{key!r}: {kernel} buckets name {'-'.join(names)}")
    nodes = int(m["nodes"]) if m["nodes"] else None
    if (nodes is not None) != BY_NODES[kernel]:
        raise InputError(f"{key!r}: {kernel} buckets {'carry' if BY_NODES[kernel] else 'have no'} /N<nodes>")
    model = tuple(int(parts[n]) for n in names)
    if min(model) < 1 or int(m["batch"]) < 1 or (nodes is not None and nodes < 1):
        raise InputError(f"{key!r}: sizes must be positive")
    return Bucket(kernel, model, int(m["batch"]), nodes)


# ---- nearest-bucket lookup -------------------------------------------------------------

def _ldist(a: float, b: float) -> float:
    return abs(math.log(max(a, 1e-9)) - math.log(max(b, 1e-9)))


def query_of(kernel: str, shape: Mapping[str, int]) -> tuple[dict[str, int], float, Optional[float]]:
    """(model dims present in the shape, batch, nodes per request or None) of a
    launch_config shape dict (a one-tile tree_verify launch: its largest tree, T)."""
    dims = {k: int(shape[k]) for k in MODEL_DIMS[kernel] if k in shape}
    batch = max(int(shape.get("B", 1)), 1)
    if kernel in LAYERED:
        batch *= max(int(shape.get("L", 1)), 1)
    nodes = None
    if kernel == "tree_verify" and is_tile_launch(shape):
        nodes = float(shape["T"])  # the one-tile kernel's cost follows the padded tree, not the mean
    elif BY_NODES[kernel] and "N" in shape:
        nodes = max(float(shape["N"]) / max(int(shape.get("B", 1)), 1), 1.0)
    return dims, float(batch), nodes


def _model_candidates(kernel: str, buckets: Sequence[Bucket], dims: Mapping[str, int]) -> list[Bucket]:
    exact = [b for b in buckets if all(b.dims.get(k) == v for k, v in dims.items())]
    if exact:
        return exact
    # Nearest value heads with the same head dims (conv: nearest D with the same width).
    fixed, free = (("W",), "D") if kernel == "tree_conv" else (("K", "V"), "HV")
    same = [b for b in buckets if all(k not in dims or b.dims[k] == dims[k] for k in fixed)]
    if not same or free not in dims:
        return []
    best = min(same, key=lambda b: (_ldist(b.dims[free], dims[free]), -b.dims[free])).dims[free]
    pool = [b for b in same if b.dims[free] == best]
    if "H" in dims:  # then the key heads, when the kernel passes them
        h = min(pool, key=lambda b: (abs(b.dims["H"] - dims["H"]), -b.dims["H"])).dims["H"]
        pool = [b for b in pool if b.dims["H"] == h]
    return pool


def nearest_bucket(buckets: Iterable[Bucket], kernel: str, shape: Mapping[str, int]) -> Optional[Bucket]:
    """The bucket whose tuned config applies to a launch of `kernel` at `shape`, or None."""
    pool = [b for b in buckets if b.kernel == kernel]
    if kernel == "tree_verify":  # a config only applies to the kernel (one-tile or blocked) it was tuned on
        tile = is_tile_launch(shape)
        pool = [b for b in pool if is_tile_launch(b.launch_shape()) == tile]
    if not pool:
        return None
    dims, batch, nodes = query_of(kernel, shape)
    pool = _model_candidates(kernel, pool, dims)
    if not pool:
        return None

    def score(b: Bucket):
        d = _ldist(b.batch, batch)
        if nodes is not None and b.nodes is not None:
            d += _ldist(b.nodes, nodes)
        return (round(d, 9), -b.batch, -(b.nodes or 0))

    return min(pool, key=score)
