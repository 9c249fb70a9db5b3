"""Transient verify memory, derived from the catalogue (paper Table I ratios)."""

from __future__ import annotations

import dataclasses

import pytest

from bole_cli.catalog.models import CATALOGUE, resolve_model
from bole_cli.errors import InputError
from bole_cli.memory import (
    dtype_bytes,
    factor_bytes_per_node_layer,
    factor_ratio,
    format_bytes,
    sglang_snapshot_buffer_bytes,
    sglang_snapshot_buffer_shape,
    snapshot_bytes_per_node_layer,
    transient_memory,
)


@pytest.mark.parametrize("name, ratio", [
    ("Qwen/Qwen3.5-4B", 85),
    ("Qwen/Qwen3.5-9B", 85),
    ("Qwen/Qwen3.5-27B", 95),
    ("Qwen/Qwen3.5-122B-A10B", 102),
])
def test_table_one_ratios(name, ratio):
    spec = resolve_model(name)
    assert round(factor_ratio(spec, "float32")) == ratio
    assert round(transient_memory(spec, 8, 64).ratio) == ratio


def test_ratios_come_from_the_shapes_not_a_table():
    for spec in CATALOGUE:
        hv, h, dk, dv = (spec.gdn_value_heads, spec.gdn_key_heads, spec.gdn_key_dim,
                         spec.gdn_value_dim)
        assert snapshot_bytes_per_node_layer(spec) == hv * dk * dv * 4
        assert factor_bytes_per_node_layer(spec) == (h * dk + hv * dv + hv) * 4
    # change the shape, the figures follow
    wide = dataclasses.replace(resolve_model("9b"), gdn_value_heads=64)
    assert round(factor_ratio(wide)) == 102


def test_bfloat16_state_halves_snapshots_only():
    spec = resolve_model("9b")
    f32 = transient_memory(spec, 4, 16, "float32")
    bf16 = transient_memory(spec, 4, 16, "bfloat16")
    assert bf16.snapshot_bytes * 2 == f32.snapshot_bytes
    assert bf16.factor_bytes == f32.factor_bytes
    assert bf16.ratio == pytest.approx(f32.ratio / 2)
    assert bf16.sglang_buffer_bytes * 2 == f32.sglang_buffer_bytes


def test_transient_memory_arithmetic():
    spec = resolve_model("9b")  # 24 GDN layers, HV 32, 8 attention layers, 4 KV heads
    m = transient_memory(spec, batch=8, nodes=32)
    assert m.gdn_layers == 24
    assert m.snapshot_bytes_per_node_layer == 32 * 128 * 128 * 4
    assert m.factor_bytes_per_node_layer == (16 * 128 + 32 * 128 + 32) * 4
    assert m.snapshot_bytes_per_layer == 8 * 32 * m.snapshot_bytes_per_node_layer
    assert m.snapshot_bytes == 24 * m.snapshot_bytes_per_layer == 12 * 2**30
    assert m.factor_bytes == 24 * 8 * 32 * m.factor_bytes_per_node_layer
    assert m.saved_bytes == m.snapshot_bytes - m.factor_bytes
    assert m.kv_bytes_per_token == 8 * 2 * 4 * 256 * 2
    assert m.kv_tokens_bought == m.saved_bytes // m.kv_bytes_per_token
    assert m.sglang_buffer_shape == (24, 9, 32, 32, 128, 128)
    assert m.sglang_buffer_bytes == 24 * 9 * 32 * 32 * 128 * 128 * 4
    assert m.kv_tokens_freed == (m.sglang_buffer_bytes - m.factor_bytes) // m.kv_bytes_per_token
    d = m.to_dict()
    assert d["sglang_buffer_shape"] == [24, 9, 32, 32, 128, 128]
    assert d["model"] == "Qwen/Qwen3.5-9B"


def test_paper_scale_of_snapshots_vs_factors():
    # the paper's 4.7-14.1 GB of snapshots against 57-151 MB of factors (B=8 territory)
    m = transient_memory(resolve_model("9b"), 8, 32)
    assert 4e9 < m.snapshot_bytes < 15e9
    assert 50e6 < m.factor_bytes < 160e6


def test_sglang_buffer_slots():
    spec = resolve_model("27b")
    assert sglang_snapshot_buffer_shape(spec, 16, 8) == (48, 17, 8, 48, 128, 128)
    assert sglang_snapshot_buffer_bytes(spec, 16, 8, "bf16") == 48 * 17 * 8 * 48 * 128 * 128 * 2
    assert transient_memory(spec, 4, 8, slots=16).sglang_buffer_shape[1] == 17


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch=0, nodes=8), "batch must be a positive integer, got 0"),
    (dict(batch=1, nodes=0), "nodes must be a positive integer, got 0"),
    (dict(batch=1, nodes=8, state_dtype="int8"), "state dtype 'int8': expected one of"),
    (dict(batch=1, nodes=8, kv_dtype="int4"), "KV dtype 'int4'"),
    (dict(batch=1, nodes=8, slots=0), "slots must be a positive integer"),
])
def test_errors(kwargs, message):
    with pytest.raises(InputError) as info:
        transient_memory(resolve_model("4b"), **kwargs)
    assert message in str(info.value)


def test_dtype_aliases():
    assert dtype_bytes("fp32") == dtype_bytes("torch.float32") == 4
    assert dtype_bytes("bf16") == 2
    assert dtype_bytes("fp8", kind="kv") == 1


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(24712) == "24.1 KiB"
    assert format_bytes(12 * 2**30) == "12.0 GiB"
    assert format_bytes(512 * 2**20) == "512 MiB"
    assert format_bytes(4.5 * 2**30) == "4.50 GiB"


def test_canonical_dtype_is_lenient_and_the_checked_lookup_is_not():
    from bole_cli.memory import canonical_dtype

    assert canonical_dtype("torch.bfloat16") == canonical_dtype("BF16") == "bfloat16"
    assert canonical_dtype(" half ") == "float16" and canonical_dtype("float") == "float32"
    assert canonical_dtype("int8") == "int8"  # unknown: returned for the caller to refuse
    assert dtype_bytes("auto", kind="kv") == 2
    with pytest.raises(InputError, match="state dtype 'int8'"):
        dtype_bytes("int8")


def test_byte_primitives_agree_with_the_spec_figures_and_the_arena_plan():
    from bole_cli.memory import FLOAT_DTYPES, conv_window_bytes, factor_bytes, state_snapshot_bytes
    from bole_cli.sglang.plan import BolePlan

    spec = resolve_model("9b")
    hv, v, k, h = spec.gdn_value_heads, spec.gdn_value_dim, spec.gdn_key_dim, spec.gdn_key_heads
    assert state_snapshot_bytes(hv, v, k, 4) == spec.gdn_state_bytes_per_layer() == hv * v * k * 4
    assert snapshot_bytes_per_node_layer(spec, "bf16") == hv * v * k * 2
    assert factor_bytes(h, k, hv, v) == factor_bytes_per_node_layer(spec) == (h * k + hv * v + hv) * 4
    assert factor_bytes(h, k, hv, v, k_bytes=2) == h * k * 2 + (hv * v + hv) * 4
    assert conv_window_bytes(spec.conv_dim, spec.conv_kernel - 1, 2) * spec.n_gdn_layers \
        == spec.conv_state_bytes()
    plan = BolePlan(layers=spec.n_gdn_layers, key_heads=h, key_dim=k, value_heads=hv, value_dim=v,
                    conv_dim=spec.conv_dim, conv_window=spec.conv_kernel - 1, draft_tokens=16,
                    rows=9, act_dtype="bfloat16", conv_dtype="bfloat16", ssm_dtype="float32")
    window = spec.conv_dim * (spec.conv_kernel - 1) * FLOAT_DTYPES["bfloat16"]
    assert plan.snapshot_node_bytes_per_layer() == snapshot_bytes_per_node_layer(spec) + window
    # the replay commit's rows: k and v in bf16, g and beta in float32, and the conv inputs
    assert plan.node_bytes_per_layer() == (h * k * 2 + hv * v * 2 + 2 * hv * 4 + spec.conv_dim * 2)
    assert factor_bytes(h, k, hv, v, k_bytes=2, v_bytes=2, scalars=2) == h * k * 2 + hv * v * 2 + 2 * hv * 4
