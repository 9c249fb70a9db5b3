"""What `bole tune-kernels` tunes: the shape buckets (bole_cli.kernels.buckets) of the
requested models, kernels, batches and tree sizes (docs/design.md §5).

Models sharing a GDN shape share its buckets (Qwen3.5-4B and 9B), so each bucket is tuned
once and its owners are listed beside it. The served commit runs over every GDN layer of a
step in one launch (a program per request and layer), so its buckets are planned at each
batch times the owners' GDN layer counts: the launches the runtime and the plug-in make.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from bole_cli.tuning.space import check_kernel

if TYPE_CHECKING:  # bole_cli.kernels loads torch and triton: imported where used
    from bole_cli.kernels.buckets import Bucket


def model_shape(kernel: str, spec) -> tuple[int, ...]:
    """A ModelSpec's shape for one kernel (see bole_cli.kernels.buckets.MODEL_DIMS)."""
    if kernel == "tree_conv":
        return (spec.conv_dim, spec.conv_kernel)
    return (spec.gdn_key_heads, spec.gdn_value_heads, spec.gdn_key_dim, spec.gdn_value_dim)


def plan_buckets(specs: Sequence, kernels: Sequence[str], batches: Sequence[int],
                 nodes: Sequence[int]) -> tuple[list["Bucket"], dict[tuple[str, tuple[int, ...]], list[str]]]:
    """Buckets to tune (deduplicated: Qwen3.5-4B and 9B share their GDN shape) and, per
    (kernel, model shape), the models that have it."""
    from bole_cli.kernels.buckets import ALL_LAYERS, BY_NODES, Bucket

    owners: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    layers: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    for kernel in kernels:
        check_kernel(kernel)
        for spec in specs:
            key = (kernel, model_shape(kernel, spec))
            names = owners.setdefault(key, [])
            if spec.name not in names:
                names.append(spec.name)
            layers.setdefault(key, set()).add(spec.n_gdn_layers if kernel in ALL_LAYERS else 1)
    out = []
    for (kernel, model) in owners:
        for b in sorted({b * n for b in batches for n in layers[(kernel, model)]}):
            if BY_NODES[kernel]:
                out.extend(Bucket(kernel, model, b, n) for n in sorted(set(nodes)))
            else:
                out.append(Bucket(kernel, model, b, None))
    return out, owners
