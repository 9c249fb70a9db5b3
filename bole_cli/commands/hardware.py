"""`bole hardware [--detect] [--json]`: the GPU catalogue (datasheet and measured ceilings)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from bole_cli.catalog.hardware import CATALOGUE, DetectedGpu, detect_gpu


def _tflops(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 1e12:g}"


def _bandwidth(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x / 1e12:g} TB/s" if x >= 1e12 else f"{x / 1e9:g} GB/s"


def _table(detected: Optional[DetectedGpu]):
    from rich import box
    from rich.table import Table

    t = Table(title="GPUs", title_justify="left", caption_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0), pad_edge=False,
              caption="Datasheet dense bf16 peak, memory bandwidth and size (decimal "
                      "units). ridge: FLOP per byte where the two balance. measured: our "
                      "own ceilings (large bf16 matmul, device-to-device copy).")
    t.add_column("key", no_wrap=True)
    t.add_column("GPU", overflow="fold")  # the name wraps first, so no figure is cut when narrow
    t.add_column("bf16\nTFLOP/s", justify="right", no_wrap=True)
    t.add_column("bandwidth", justify="right", no_wrap=True)
    t.add_column("memory", justify="right", overflow="fold")
    t.add_column("ridge\nFLOP/B", justify="right", no_wrap=True)
    t.add_column("measured\nTFLOP/s", justify="right", no_wrap=True)
    t.add_column("measured\nbandwidth", justify="right", no_wrap=True)
    match = detected.spec.key if detected and detected.spec else None
    for g in CATALOGUE:
        mem = f"{g.memory_bytes / 1e9:g} GB" + (" unif." if g.unified_memory else "")
        t.add_row(g.key, g.name, _tflops(g.bf16_flops), _bandwidth(g.mem_bandwidth), mem,
                  f"{g.ridge_point:.0f}", _tflops(g.measured_bf16_flops),
                  _bandwidth(g.measured_mem_bandwidth),
                  style="bold green" if g.key == match else None)
    return t


def _detected_line(detected: Optional[DetectedGpu]) -> str:
    from rich.markup import escape

    if detected is None:
        return "detected: no CUDA device"
    line = (f"detected: {escape(detected.name)} (device {detected.index}, "
            f"{detected.sm_count} SMs, {detected.memory_bytes / 1e9:.1f} GB, "
            f"sm_{detected.compute_capability[0]}{detected.compute_capability[1]}) -> "
            f"{detected.spec.key if detected.spec else 'not in the catalogue'}")
    if detected.mismatch:
        line += f" [yellow](note: {escape(detected.mismatch)})[/]"
    return line


def hardware(
    detect: bool = typer.Option(
        False, "--detect", help="Also report the CUDA device present (imports torch)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The GPU catalogue: bf16 peak, memory bandwidth and size, measured ceilings."""
    from bole_cli.console import emit_json, out

    detected = detect_gpu() if detect else None
    if json_out:
        payload: dict[str, Any] = {
            "gpus": [g.to_dict() for g in CATALOGUE],
            "detection": ("not-requested" if not detect
                          else "found" if detected else "no-cuda"),
            "detected": detected.to_dict() if detected else None,
        }
        emit_json(payload)
        return
    out.print(_table(detected))
    if detect:
        out.print(_detected_line(detected))


def register(app: typer.Typer) -> None:
    app.command("hardware")(hardware)

