"""`bole models [NAME] [--json]`: the hybrid-model catalogue and a user's config.json."""

from __future__ import annotations

from typing import Any, Optional

import typer

from bole_cli.catalog.models import CATALOGUE, ModelSpec, resolve_model
from bole_cli.memory import format_bytes

MIB = 2**20


def model_record(spec: ModelSpec) -> dict[str, Any]:
    """The JSON object for one model: its shapes plus every derived byte figure."""
    return {**spec.to_dict(), "derived": spec.derived()}


def _gdn_shape(s: ModelSpec) -> str:
    return f"{s.gdn_key_heads}/{s.gdn_value_heads}/{s.gdn_key_dim}/{s.gdn_value_dim}"


def _ffn(s: ModelSpec) -> str:
    if s.is_moe:
        return f"{s.experts}x{s.expert_ffn} k{s.experts_top_k}"
    return f"{s.ffn}" + (" tied" if s.tied_embeddings else "")


def _mib_number(n: int) -> str:
    v = n / MIB
    return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"


def _table(specs: tuple[ModelSpec, ...]):
    from rich import box
    from rich.table import Table

    from bole_cli.console import shown_text

    # Sized to fit 80 columns: one space between columns, details in `bole models NAME`.
    t = Table(title="Hybrid GDN models", title_justify="left", caption_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0), pad_edge=False,
              caption="GDN: key heads H, value heads "
                      "HV, key/value dims dk/dv. FFN: its width, 'tied' when the input and "
                      "output embeddings share weights; MoE: experts x expert size, top-k. "
                      "state: one request's fp32 GDN state over all GDN layers, which is "
                      "also what a snapshotting tree verifier writes per draft node. "
                      "Details and Bole's per-node factors: `bole models NAME`.")
    t.add_column("model", overflow="fold")  # folds first, so no figure is cut when narrow
    t.add_column("layers\n(attn)", justify="right", no_wrap=True)
    t.add_column("hidden", justify="right", no_wrap=True)
    t.add_column("GDN\nH/HV/dk/dv", justify="right", no_wrap=True)
    t.add_column("attn\nq/kv", justify="right", no_wrap=True)
    t.add_column("FFN\nor MoE", justify="right")
    t.add_column("state\nMiB", justify="right", no_wrap=True)
    for s in specs:
        # one column: a snapshot is the whole state (s.snapshot_bytes_per_node() equals
        # s.gdn_state_bytes() for every model; tests/test_catalog.py holds them equal)
        t.add_row(shown_text(s.short_name), f"{s.layers} ({s.n_attention_layers})",
                  str(s.hidden), _gdn_shape(s), f"{s.attn_heads}/{s.attn_kv_heads}", _ffn(s),
                  _mib_number(s.gdn_state_bytes()))
    return t


def _detail(s: ModelSpec):
    from rich.table import Table

    from bole_cli.console import shown_text

    t = Table(title=shown_text(s.name), title_justify="left", show_header=False, box=None,
              padding=(0, 2))
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")  # a long path goes on over lines, never cut to an ellipsis
    ids = s.attention_layer_ids
    pattern = (f"every {s.full_attention_interval}th" if s.full_attention_interval
               else "irregular")
    rows = [
        ("source", shown_text(s.source)),
        ("aliases", ", ".join(map(shown_text, s.aliases)) or "-"),
        ("layers", f"{s.layers}: {s.n_gdn_layers} GDN + {s.n_attention_layers} full attention "
                   f"({pattern}: {', '.join(map(str, ids)) or 'none'})"),
        ("hidden", str(s.hidden)),
        ("vocab", f"{s.vocab}" + (" (tied embeddings)" if s.tied_embeddings else "")),
        ("GDN heads", f"H={s.gdn_key_heads} key, HV={s.gdn_value_heads} value "
                      f"(GQA group {s.gqa_group}); dk={s.gdn_key_dim}, dv={s.gdn_value_dim}"),
        ("GDN conv", f"kernel {s.conv_kernel} over {s.conv_dim} channels (q|k|v)"),
        ("attention", f"{s.attn_heads} q / {s.attn_kv_heads} kv heads, head_dim "
                      f"{s.attn_head_dim}"),
        ("FFN", s.ffn_description()),
        ("MTP layers", str(s.mtp_layers)),
        ("GDN state/request", f"{format_bytes(s.gdn_state_bytes())} fp32 "
                              f"({format_bytes(s.gdn_state_bytes_per_layer())} per layer)"),
        ("conv state/request", f"{format_bytes(s.conv_state_bytes())} bf16"),
        ("KV cache/token", f"{format_bytes(s.kv_bytes_per_token())} bf16"),
        ("snapshot/draft node", f"{format_bytes(s.snapshot_bytes_per_node())} (full fp32 state, "
                                "all GDN layers)"),
        ("factors/draft node", f"{format_bytes(s.factor_bytes_per_node())} (k, u, log_p; "
                               f"{s.snapshot_factor_ratio():.0f}x less)"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def models(
    name: Optional[str] = typer.Argument(
        None,
        help="A model name or alias (9b, qwen3.5-9b, Qwen/Qwen3.5-9B), or the path of a "
             "Hugging Face config.json (or its directory). Omit to list the catalogue."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The hybrid GDN model catalogue: shapes, GDN state and per-node snapshot bytes."""
    from bole_cli.console import emit_json, out

    if name is None:
        if json_out:
            emit_json({"models": [model_record(s) for s in CATALOGUE]})
        else:
            out.print(_table(CATALOGUE))
        return
    spec = resolve_model(name)
    if json_out:
        emit_json(model_record(spec))
    else:
        out.print(_detail(spec))


def register(app: typer.Typer) -> None:
    app.command("models")(models)
