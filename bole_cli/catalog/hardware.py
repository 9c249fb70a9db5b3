"""The GPU catalogue: datasheet ceilings plus what we measured (docs/design.md §8).

Plain numbers in SI units so a roofline model can use them directly: FLOP/s, bytes/s,
bytes. Datasheet memory is decimal (80 GB = 80e9 bytes), as the vendors quote it.
Importing this module is cheap; only `detect_gpu()` imports torch, and only when called.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from bole_cli.errors import InputError

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class GpuSpec:
    key: str  # short canonical name: "h200"
    name: str  # marketing name: "H200 SXM"
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s (datasheet)
    mem_bandwidth: float  # device memory bandwidth, bytes/s (datasheet)
    memory_bytes: int  # device memory, bytes (datasheet, decimal GB)
    memory_kind: str = "HBM"
    unified_memory: bool = False  # CPU and GPU share the memory (GB10)
    # Measured ceilings on a real device (None = not measured here).
    measured_bf16_flops: Optional[float] = None  # large bf16 matmul, FLOP/s
    measured_mem_bandwidth: Optional[float] = None  # device-to-device copy, bytes/s
    note: str = ""
    # A word matched in torch's device name ("NVIDIA H200" -> H200).
    match: str = ""
    aliases: tuple[str, ...] = field(default=(), compare=False)

    @property
    def attainable_bf16_flops(self) -> float:
        """The measured ceiling when we have one, else the datasheet peak."""
        return self.measured_bf16_flops or self.bf16_flops

    @property
    def attainable_mem_bandwidth(self) -> float:
        return self.measured_mem_bandwidth or self.mem_bandwidth

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where bf16 compute and bandwidth balance."""
        return self.bf16_flops / self.mem_bandwidth

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        d["ridge_point"] = round(self.ridge_point, 1)
        return d


CATALOGUE: tuple[GpuSpec, ...] = (
    GpuSpec("a100", "A100 SXM4 80GB", 312 * TERA, 2.04 * TERA, 80 * 10**9,
            memory_kind="HBM2e", match="A100", aliases=("a100-80gb", "a100-sxm4-80gb")),
    GpuSpec("h100", "H100 SXM", 989 * TERA, 3.35 * TERA, 80 * 10**9,
            memory_kind="HBM3", match="H100", aliases=("h100-sxm",)),
    GpuSpec("h200", "H200 SXM", 989 * TERA, 4.8 * TERA, 141 * 10**9,
            memory_kind="HBM3e", match="H200", aliases=("h200-sxm",),
            measured_bf16_flops=790 * TERA, measured_mem_bandwidth=4.27 * TERA,
            note="measured: 8192^3 bf16 matmul ~790 TFLOP/s, device-to-device copy 4.27 TB/s"),
    GpuSpec("gb10", "GB10 (DGX Spark)", 125 * TERA, 273 * GIGA, 128 * 10**9,
            memory_kind="LPDDR5x", unified_memory=True, match="GB10",
            aliases=("dgx-spark", "spark"),
            note="dense bf16 derived from NVIDIA's 1 PFLOP FP4 with sparsity: / 2 dense, / 4 "
                 "bf16 against FP4 (Blackwell's tensor-core ratio, as B200's 9 PFLOP FP4 to "
                 "2.25 bf16); the Bole paper quotes 256"),
    GpuSpec("b200", "B200", 2250 * TERA, 8 * TERA, 180 * 10**9,
            memory_kind="HBM3e", match="B200", aliases=("b200-sxm",)),
)

_INDEX: dict[str, GpuSpec] = {}
for _g in CATALOGUE:
    for _k in (_g.key, _g.name, *_g.aliases):
        _INDEX[_k.strip().lower()] = _g


def known_gpu_names() -> list[str]:
    return [g.key for g in CATALOGUE]


def resolve_gpu(name: str, option: str = "--gpu") -> GpuSpec:
    """A catalogue GPU by key, name or alias (case-insensitive), or a device name as torch
    reports it ("NVIDIA H100 80GB HBM3"). InputError (naming `option`) lists the known, and
    refuses a name of another part of a catalogue family (another memory size, a PCIe or
    NVL card): its figures would be the catalogue part's, and its memory check wrong."""
    spec = _INDEX.get(str(name).strip().lower())
    if spec is not None:
        return spec
    spec = match_gpu(str(name))  # also accept a device name: "NVIDIA H200"
    if spec is None:
        known = ", ".join(g.key for g in CATALOGUE)
        raise InputError(f"{option}: unknown GPU {name!r}; known: {known} (`bole hardware`)")
    other = _other_part(str(name), spec)
    if other:
        raise InputError(f"{option}: {name!r} is {other}; the catalogue's {spec.key} is the "
                         f"{spec.name}, whose figures would not apply ({option} {spec.key} "
                         "takes them anyway)")
    return spec


#: A memory size in a device name ("80GB", "141GB"), not a MIG slice's ("3g.20gb").
_NAMED_SIZE = re.compile(r"(?<![.\d])(\d+)\s*GB\b", re.I)
#: A size within this fraction of the catalogue's names the same part (B200: 180 GB usable,
#: 192 GB quoted).
_SIZE_TOLERANCE = 0.1


def _other_part(name: str, spec: GpuSpec) -> str:
    """What a name says that differs from the catalogue part of its family ('' if nothing):
    a PCIe or NVL form factor, or another memory size written as "40GB"."""
    form = _form_factor(name)
    if form:
        return form
    sizes = [int(m) for m in _NAMED_SIZE.findall(name)]
    catalogue_gb = spec.memory_bytes / 1e9
    if sizes and abs(sizes[0] - catalogue_gb) > _SIZE_TOLERANCE * catalogue_gb:
        return f"a {sizes[0]} GB card"
    return ""


def _form_factor(name: str) -> str:
    """'a PCIe card' / 'an NVL card' where the name says so (the catalogue holds SXM parts)."""
    words = [w for w in ("PCIe", "NVL") if re.search(rf"\b{w}\b", name, re.I)]
    return f"{'an' if words[0] == 'NVL' else 'a'} {'/'.join(words)} card" if words else ""


def match_gpu(device_name: str) -> Optional[GpuSpec]:
    """The catalogue entry whose family word appears in a device name, else None.

    Whole words only, so "NVIDIA GB200" is not taken for a B200.
    """
    for g in CATALOGUE:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(g.match)}(?![0-9])", device_name, re.I):
            return g
    return None


@dataclass(frozen=True)
class DetectedGpu:
    """The CUDA device present, as torch reports it, and its catalogue entry (if any)."""

    name: str
    memory_bytes: int
    sm_count: int
    compute_capability: tuple[int, int]
    index: int = 0
    spec: Optional[GpuSpec] = None
    mismatch: str = ""  # why the catalogue figures may not apply (another memory size...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "memory_bytes": self.memory_bytes,
            "sm_count": self.sm_count,
            "compute_capability": list(self.compute_capability),
            "catalogue": self.spec.key if self.spec else None,
            "mismatch": self.mismatch,
        }


def _mismatch(name: str, memory_bytes: int, spec: GpuSpec) -> str:
    form = _form_factor(name)  # the size: the memory measured says it, below
    if form:
        return f"{name} is {form}; catalogue figures are for the {spec.name}"
    if abs(memory_bytes - spec.memory_bytes) > 0.15 * spec.memory_bytes:
        return (f"{memory_bytes / 1e9:.0f} GB of memory differs from the catalogue "
                f"{spec.name} ({spec.memory_bytes / 1e9:.0f} GB)")
    return ""


#: The CUDA driver's library under each system's name.
_CUDA_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def cuda_driver_missing() -> bool:
    """True when no CUDA driver library loads, so no GPU can be present: known in
    milliseconds, before torch's import (seconds) is paid for a refusal."""
    import ctypes

    for name in _CUDA_DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return False
    return True


def detect_gpu(index: Optional[int] = None) -> Optional[DetectedGpu]:
    """The present CUDA device (the current one unless `index`), or None without CUDA.

    Imports torch when a CUDA driver is present, so call it only when the answer is needed.
    """
    if cuda_driver_missing():
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    name = str(props.name)
    memory = int(props.total_memory)
    spec = match_gpu(name)
    return DetectedGpu(
        name=name,
        memory_bytes=memory,
        sm_count=int(props.multi_processor_count),
        compute_capability=(int(props.major), int(props.minor)),
        index=int(index),
        spec=spec,
        mismatch=_mismatch(name, memory, spec) if spec else "",
    )
