"""Model and GPU catalogues, Hugging Face config loading, `bole models` / `bole hardware`."""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bole_cli.catalog import hardware as hw
from bole_cli.catalog.models import CATALOGUE, ModelSpec, load_hf_config, resolve_model
from bole_cli.cli import app
from bole_cli.errors import InputError

CONFIGS = Path(__file__).parent / "data" / "configs"
MIB = 2**20

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


# ---- the model catalogue against the published shapes -------------------------------
# (name, layers, hidden, q heads, kv heads, HV, FFN or (experts, top-k, expert, shared),
#  tied, GDN state MiB per request) copied from the model cards, independent of models.py.
FACTS_MODELS = [
    ("Qwen/Qwen3.5-0.8B", 24, 1024, 8, 2, 16, 3584, True, 18),
    ("Qwen/Qwen3.5-2B", 24, 2048, 8, 2, 16, 6144, True, 18),
    ("Qwen/Qwen3.5-4B", 32, 2560, 16, 4, 32, 9216, True, 48),
    ("Qwen/Qwen3.5-9B", 32, 4096, 16, 4, 32, 12288, False, 48),
    ("Qwen/Qwen3.5-27B", 64, 5120, 24, 4, 48, 17408, False, 144),
    ("Qwen/Qwen3.5-35B-A3B", 40, 2048, 16, 2, 32, (256, 8, 512, 512), False, 60),
    ("Qwen/Qwen3.5-122B-A10B", 48, 3072, 32, 2, 64, (256, 8, 1024, 1024), False, 144),
    ("Qwen/Qwen3.5-397B-A17B", 60, 4096, 32, 2, 64, (512, 10, 1024, 0), False, 180),
    ("Qwen/Qwen3-Next-80B-A3B", 48, 2048, 16, 2, 32, (512, 10, 512, 512), False, 72),
]


def test_catalogue_lists_exactly_the_facts_models_in_order():
    assert [s.name for s in CATALOGUE] == [row[0] for row in FACTS_MODELS]


@pytest.mark.parametrize("row", FACTS_MODELS, ids=[r[0] for r in FACTS_MODELS])
def test_catalogue_matches_facts(row):
    name, layers, hidden, q, kv, hv, ffn, tied, state_mib = row
    s = resolve_model(name)
    assert (s.layers, s.hidden, s.attn_heads, s.attn_kv_heads, s.gdn_value_heads) == (
        layers, hidden, q, kv, hv)
    # Shared by the whole family: H=16, dk=dv=128, conv 4, head_dim 256.
    assert (s.gdn_key_heads, s.gdn_key_dim, s.gdn_value_dim) == (16, 128, 128)
    assert (s.conv_kernel, s.attn_head_dim, s.mtp_layers) == (4, 256, 1)
    assert s.vocab == (151936 if "Next" in name else 248320)
    if isinstance(ffn, tuple):
        assert s.is_moe and s.ffn == 0
        assert (s.experts, s.experts_top_k, s.expert_ffn, s.shared_expert_ffn) == ffn
    else:
        assert not s.is_moe and s.ffn == ffn
    assert s.tied_embeddings is tied
    # Every 4th layer is full attention: indices 3, 7, 11, ...
    assert s.attention_layer_ids == tuple(range(3, layers, 4))
    assert s.n_gdn_layers == layers * 3 // 4
    # The published MiB per request, exactly.
    assert s.gdn_state_bytes() == state_mib * MIB
    assert s.snapshot_bytes_per_node() == state_mib * MIB


@pytest.mark.parametrize("hv,ratio", [(32, 85), (48, 95), (64, 102)])
def test_factor_ratio_matches_the_paper(hv, ratio):
    s = next(m for m in CATALOGUE if m.gdn_value_heads == hv)
    assert round(s.snapshot_factor_ratio()) == ratio
    per_layer = (16 * 128 + hv * 128 + hv) * 4
    assert s.factor_bytes_per_node() == s.n_gdn_layers * per_layer


def test_derived_bytes_of_the_9b():
    d = resolve_model("9b").derived()
    assert d == {
        "n_gdn_layers": 24, "n_attention_layers": 8, "gqa_group": 2, "conv_dim": 8192,
        "gdn_state_bytes_per_layer": 2 * MIB, "gdn_state_bytes": 48 * MIB,
        "conv_state_bytes": 24 * 8192 * 3 * 2, "snapshot_bytes_per_node": 48 * MIB,
        "factor_bytes_per_node": 24 * (2048 + 4096 + 32) * 4,
        "snapshot_factor_ratio": 84.89, "kv_bytes_per_token": 8 * 2 * 4 * 256 * 2,
    }


def test_model_spec_is_frozen_and_validates_layout():
    s = resolve_model("9b")
    with pytest.raises(FrozenInstanceError):
        s.layers = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="full_attention_interval"):
        ModelSpec("x", 8, 64, 2, 1, 2, 100, full_attention_interval=0)
    none = ModelSpec("x", 8, 64, 2, 1, 2, 100, full_attention_layers=())
    assert none.n_attention_layers == 0 and none.n_gdn_layers == 8


# ---- name resolution ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["9b", "9B", "qwen3.5-9b", "Qwen3.5-9B", "Qwen/Qwen3.5-9B",
                                  "qwen/qwen3.5-9b", "  9b "])
def test_resolve_model_aliases(name):
    assert resolve_model(name).name == "Qwen/Qwen3.5-9B"


def test_every_name_and_alias_resolves_to_its_own_model():
    seen: dict[str, str] = {}
    for s in CATALOGUE:
        for key in (s.name, s.short_name, *s.aliases):
            assert key.lower() not in seen, f"{key} names both {seen.get(key.lower())} and {s.name}"
            seen[key.lower()] = s.name
            assert resolve_model(key) is s
            assert resolve_model(key.upper()) is s


def test_unknown_model_is_input_error_listing_known_names():
    with pytest.raises(InputError) as info:
        resolve_model("qwen3.5-10b")
    assert info.value.exit_code == 2
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "qwen3.5-10b" in msg and "`bole models`" in msg  # the full names are there
    for s in CATALOGUE:
        assert s.aliases[0] in msg.split(";")[1].replace(",", " ").split()


def test_missing_config_path_is_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        resolve_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(InputError, match="not found"):
        load_hf_config(tmp_path)  # a directory without config.json


# ---- Hugging Face config.json --------------------------------------------------------
def _comparable(s: ModelSpec) -> dict:
    d = s.to_dict()
    for k in ("name", "aliases", "source"):
        d.pop(k)
    return d


def test_flat_qwen3_next_config_reproduces_the_catalogue():
    path = CONFIGS / "qwen3_next_80b_a3b.json"
    s = resolve_model(str(path))
    assert _comparable(s) == _comparable(resolve_model("qwen3-next"))
    assert s.source == str(path) and s.name == "qwen3_next_80b_a3b"
    assert s.gdn_state_bytes() == 72 * MIB


def test_text_config_qwen35_reproduces_the_catalogue():
    s = load_hf_config(CONFIGS / "qwen3_5_9b.json")
    assert _comparable(s) == _comparable(resolve_model("9b"))
    assert s.full_attention_layers == tuple(range(3, 32, 4))  # from layer_types


def test_model_directory_and_top_level_fallback():
    # The directory's config.json keeps tie_word_embeddings only at top level.
    s = resolve_model(CONFIGS / "qwen3_5_0_8b")
    assert s.name == "qwen3_5_0_8b"
    assert s.tied_embeddings is True
    assert _comparable(s) == _comparable(resolve_model("0.8b"))


def _write(tmp_path: Path, data) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def _q35() -> dict:
    return json.loads((CONFIGS / "qwen3_5_9b.json").read_text())


def _next() -> dict:
    return json.loads((CONFIGS / "qwen3_next_80b_a3b.json").read_text())


def test_text_config_wins_over_top_level(tmp_path):
    data = _q35()
    data["hidden_size"] = 8  # a vision-side or stale value must not leak in
    data["tie_word_embeddings"] = True
    data["text_config"]["tie_word_embeddings"] = False
    s = load_hf_config(_write(tmp_path, data))
    assert s.hidden == 4096 and s.tied_embeddings is False


REQUIRED = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "vocab_size", "intermediate_size"]


@pytest.mark.parametrize("field", REQUIRED)
def test_missing_required_field_names_field_and_file(tmp_path, field):
    data = _q35()
    del data["text_config"][field]
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as info:
        load_hf_config(path)
    assert f"text_config.{field}" in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("field", ["num_experts_per_tok", "moe_intermediate_size"])
def test_moe_config_needs_its_moe_fields(tmp_path, field):
    data = _next()
    del data[field]
    with pytest.raises(InputError, match=rf"missing required field '{field}'"):
        load_hf_config(_write(tmp_path, data))


@pytest.mark.parametrize("value", ["4096", 4096.0, True, None, [4096]])
def test_wrong_typed_field_names_field(tmp_path, value):
    data = _next()
    data["hidden_size"] = value
    path = _write(tmp_path, data)
    with pytest.raises(InputError, match=r"'hidden_size'") as info:
        load_hf_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("field,value,match", [
    ("num_hidden_layers", 0, "must be >= 1"),
    ("tie_word_embeddings", "yes", "true or false"),
    ("linear_num_value_heads", 24, "multiple of 'linear_num_key_heads'"),
    ("num_key_value_heads", 3, "multiple of 'num_key_value_heads'"),
    ("num_experts_per_tok", 600, "exceeds 'num_experts'"),
])
def test_invalid_values(tmp_path, field, value, match):
    data = _next()
    data[field] = value
    with pytest.raises(InputError, match=match):
        load_hf_config(_write(tmp_path, data))


def test_layer_structure_is_required(tmp_path):
    data = _next()
    del data["full_attention_interval"]
    with pytest.raises(InputError, match="layer_types"):
        load_hf_config(_write(tmp_path, data))


@pytest.mark.parametrize("layer_types,match", [
    (["linear_attention"] * 31, "lists 31 layers but num_hidden_layers is 32"),
    (["linear_attention"] * 31 + ["mamba"], "unknown layer type"),
    ("linear_attention", "list of strings"),
])
def test_bad_layer_types(tmp_path, layer_types, match):
    data = _q35()
    data["text_config"]["layer_types"] = layer_types
    with pytest.raises(InputError, match=match):
        load_hf_config(_write(tmp_path, data))


def test_irregular_and_all_linear_layer_types(tmp_path):
    data = _q35()
    types_ = ["linear_attention"] * 32
    types_[5] = types_[20] = "full_attention"
    data["text_config"]["layer_types"] = types_
    s = load_hf_config(_write(tmp_path, data))
    assert s.attention_layer_ids == (5, 20) and s.full_attention_interval == 0
    assert s.gdn_state_bytes() == 30 * 2 * MIB
    data["text_config"]["layer_types"] = ["linear_attention"] * 32
    s = load_hf_config(_write(tmp_path, data))
    assert s.n_attention_layers == 0 and s.kv_bytes_per_token() == 0
    assert s.gdn_state_bytes() == 32 * 2 * MIB


def test_dense_defaults(tmp_path):
    data = _next()
    for k in ("num_experts", "head_dim", "linear_conv_kernel_dim", "mtp_num_hidden_layers",
              "tie_word_embeddings"):
        del data[k]
    s = load_hf_config(_write(tmp_path, data))
    assert not s.is_moe and s.ffn == 5120
    assert s.attn_head_dim == 2048 // 16 and s.conv_kernel == 4
    assert s.mtp_layers == 0 and s.tied_embeddings is False


@pytest.mark.parametrize("text,match", [
    ("{not json", "invalid JSON at line 1"),
    ("[1, 2]", "expected a JSON object"),
    ('{"text_config": 3}', "'text_config' must be an object"),
])
def test_malformed_files(tmp_path, text, match):
    with pytest.raises(InputError, match=match):
        load_hf_config(_write(tmp_path, text))


def test_binary_file_is_input_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe\x00bin")
    with pytest.raises(InputError, match="UTF-8"):
        load_hf_config(p)


# ---- the GPU catalogue -----------------------------------------------------------------
# (key, bf16 TFLOP/s, TB/s, GB) from the datasheets. GB10's dense bf16 is derived from
# NVIDIA's "1 PFLOP FP4 with sparsity" (/ 2 dense, / 4 bf16 to FP4, Blackwell's ratio, as
# B200's 9 PFLOP FP4 to 2.25 bf16): 125, not the 256 the Bole paper quotes (issue 16).
FACTS_GPUS = [("a100", 312, 2.04, 80), ("h100", 989, 3.35, 80), ("h200", 989, 4.8, 141),
              ("gb10", 125, 0.273, 128), ("b200", 2250, 8, 180)]


@pytest.mark.parametrize("key,tflops,tbps,gb", FACTS_GPUS)
def test_gpu_catalogue_matches_facts(key, tflops, tbps, gb):
    g = hw.resolve_gpu(key)
    assert g.key == key
    assert g.bf16_flops == pytest.approx(tflops * 1e12)
    assert g.mem_bandwidth == pytest.approx(tbps * 1e12)
    assert g.memory_bytes == gb * 10**9 and isinstance(g.memory_bytes, int)
    assert g.ridge_point == pytest.approx(tflops / tbps)


def test_gpu_catalogue_order_and_measured_h200():
    assert [g.key for g in hw.CATALOGUE] == [k for k, *_ in FACTS_GPUS]
    h200 = hw.resolve_gpu("H200")
    assert h200.measured_mem_bandwidth == pytest.approx(4.27e12)
    assert h200.measured_bf16_flops == pytest.approx(790e12)
    assert h200.attainable_mem_bandwidth == pytest.approx(4.27e12)
    a100 = hw.resolve_gpu("a100")
    assert a100.measured_bf16_flops is None and a100.attainable_bf16_flops == a100.bf16_flops
    assert hw.resolve_gpu("gb10").unified_memory is True


@pytest.mark.parametrize("name,key", [("a100", "a100"), ("A100 SXM4 80GB", "a100"),
                                      ("dgx-spark", "gb10"), (" B200 ", "b200"),
                                      ("NVIDIA H200", "h200"), ("h100-sxm", "h100")])
def test_resolve_gpu(name, key):
    assert hw.resolve_gpu(name).key == key


def test_unknown_gpu_lists_known():
    with pytest.raises(InputError) as info:
        hw.resolve_gpu("v100")
    assert "v100" in str(info.value)
    for g in hw.CATALOGUE:
        assert g.key in str(info.value)


@pytest.mark.parametrize("device,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GB10", "gb10"), ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", None), ("NVIDIA GH200 480GB", None), ("Tesla V100-SXM2-16GB", None),
    ("NVIDIA GeForce RTX 4090", None), ("NVIDIA H20", None),
])
def test_match_gpu_by_device_name(device, key):
    g = hw.match_gpu(device)
    assert (g.key if g else None) == key


def _fake_cuda(monkeypatch, name, total_memory, sms=132, cc=(9, 0)):
    torch = pytest.importorskip("torch")
    props = types.SimpleNamespace(name=name, total_memory=total_memory,
                                  multi_processor_count=sms, major=cc[0], minor=cc[1])
    monkeypatch.setattr(hw, "cuda_driver_missing", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def test_detect_gpu_matches_catalogue(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H200", 143771 * MIB)
    d = hw.detect_gpu()
    assert d is not None and d.spec is hw.resolve_gpu("h200")
    assert (d.name, d.sm_count, d.memory_bytes, d.compute_capability) == (
        "NVIDIA H200", 132, 143771 * MIB, (9, 0))
    assert d.mismatch == ""
    assert d.to_dict()["catalogue"] == "h200"


@pytest.mark.parametrize("name,memory,key,note", [
    ("NVIDIA A100-SXM4-40GB", 40 * 2**30, "a100", "differs"),
    ("NVIDIA H100 PCIe", 80 * 2**30, "h100", "PCIe"),
    ("NVIDIA L40S", 45 * 2**30, None, ""),
])
def test_detect_gpu_flags_variants(monkeypatch, name, memory, key, note):
    _fake_cuda(monkeypatch, name, memory)
    d = hw.detect_gpu()
    assert (d.spec.key if d.spec else None) == key
    assert note in d.mismatch and (bool(d.mismatch) == bool(note))


def test_detect_gpu_without_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hw.detect_gpu() is None


def test_detect_gpu_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert hw.detect_gpu() is None


# ---- `bole models` / `bole hardware` ---------------------------------------------------
MODEL_KEYS = {"name", "layers", "hidden", "attn_heads", "attn_kv_heads", "gdn_value_heads",
              "vocab", "ffn", "experts", "experts_top_k", "expert_ffn", "shared_expert_ffn",
              "tied_embeddings", "gdn_key_heads", "gdn_key_dim", "gdn_value_dim",
              "conv_kernel", "attn_head_dim", "full_attention_interval",
              "full_attention_layers", "mtp_layers", "aliases", "source", "derived"}
GPU_KEYS = {"key", "name", "bf16_flops", "mem_bandwidth", "memory_bytes", "memory_kind",
            "unified_memory", "measured_bf16_flops", "measured_mem_bandwidth", "note",
            "match", "aliases", "ridge_point"}


def test_models_json_lists_the_catalogue_with_stable_keys():
    r = runner.invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"models"}
    assert [m["name"] for m in data["models"]] == [s.name for s in CATALOGUE]
    for m, row in zip(data["models"], FACTS_MODELS):
        assert set(m) == MODEL_KEYS
        assert m["derived"]["gdn_state_bytes"] == row[-1] * MIB


def test_models_name_json_is_one_record():
    r = runner.invoke(app, ["models", "9b", "--json"])
    assert r.exit_code == 0, r.stderr
    m = json.loads(r.stdout)
    assert set(m) == MODEL_KEYS and m["name"] == "Qwen/Qwen3.5-9B"
    assert m["full_attention_layers"] == list(range(3, 32, 4))
    assert m["derived"]["snapshot_bytes_per_node"] == 48 * MIB


def test_models_table_shows_every_model_and_fits_80_columns():
    r = runner.invoke(app, ["models"])
    assert r.exit_code == 0, r.stderr
    assert "…" not in r.stdout  # nothing truncated at the default 80 columns
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    for name, *_, mib in FACTS_MODELS:
        short = name.split("/")[1]
        # model ... state MiB (a snapshot is the whole state: one column), on its own row
        assert re.search(rf"^{re.escape(short)} .* {mib}$", r.stdout, re.M), short
    caption = " ".join(r.stdout.split())
    assert "'tied' when the input and output embeddings share weights" in caption
    assert "also what a snapshotting tree verifier writes per draft node" in caption


def test_models_detail_and_config_path():
    r = runner.invoke(app, ["models", "Qwen/Qwen3.5-27B"])
    assert r.exit_code == 0, r.stderr
    assert "Qwen/Qwen3.5-27B" in r.stdout and "144 MiB" in r.stdout and "95x" in r.stdout
    r = runner.invoke(app, ["models", str(CONFIGS / "qwen3_next_80b_a3b.json"), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["derived"]["gdn_state_bytes"] == 72 * MIB


def test_models_detail_shows_a_long_config_path_whole(tmp_path):
    """A config's path longer than the line goes on over lines, never cut to an ellipsis."""
    deep = tmp_path / ("a-long-folder-name-" * 4) / "checkpoint"
    deep.mkdir(parents=True)
    (deep / "config.json").write_bytes((CONFIGS / "qwen3_5_9b.json").read_bytes())
    r = runner.invoke(app, ["models", str(deep)], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.stderr
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 60
    assert str(deep / "config.json") in "".join(line.strip() for line in r.stdout.splitlines())


def test_models_unknown_name_is_one_red_line_exit_2():
    r = runner.invoke(app, ["models", "qwen3.5-10b"])
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown model 'qwen3.5-10b'")
    assert " 9b," in lines[0] and len(lines[0]) < 160


def test_models_bad_config_names_the_field(tmp_path):
    data = _q35()
    data["text_config"]["hidden_size"] = "big"
    path = _write(tmp_path, data)
    r = runner.invoke(app, ["models", str(path)])
    assert r.exit_code == 2
    assert "text_config.hidden_size" in r.stderr and str(path) in r.stderr.replace("\n", "")


def test_hardware_json_with_stable_keys():
    r = runner.invoke(app, ["hardware", "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"gpus", "detection", "detected"}
    assert data["detection"] == "not-requested" and data["detected"] is None
    assert [g["key"] for g in data["gpus"]] == [k for k, *_ in FACTS_GPUS]
    for g in data["gpus"]:
        assert set(g) == GPU_KEYS


def test_hardware_detect(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H200", 143771 * MIB)
    r = runner.invoke(app, ["hardware", "--detect", "--json"])
    data = json.loads(r.stdout)
    assert data["detection"] == "found" and data["detected"]["catalogue"] == "h200"
    r = runner.invoke(app, ["hardware", "--detect"])
    assert "detected: NVIDIA H200" in r.stdout and "-> h200" in r.stdout
    monkeypatch.setattr(sys.modules["torch"].cuda, "is_available", lambda: False)
    r = runner.invoke(app, ["hardware", "--detect", "--json"])
    assert json.loads(r.stdout)["detection"] == "no-cuda"


def test_hardware_table():
    r = runner.invoke(app, ["hardware"])
    assert r.exit_code == 0, r.stderr
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    h200 = next(line for line in r.stdout.splitlines() if line.startswith("h200"))
    assert re.search(r"989 +4\.8 TB/s +141 GB +206 +790 +4\.27 TB/s$", h200), h200



def test_models_escapes_control_characters_and_markup_of_a_config(tmp_path):
    """A downloaded config's strings reach the terminal inert: ESC and other control
    characters shown as repr shows them, Rich markup printed as text."""
    data = _q35()
    data["_name_or_path"] = "evil\x1b]0;pwned\x07\x1b[31m[bold]red[/bold]\x08\u202e"
    folder = tmp_path / "cfg\x1b[2J"
    folder.mkdir()
    path = _write(folder, data)
    r = runner.invoke(app, ["models", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stderr
    assert not any(c in r.stdout for c in "\x1b\x07\x08\u202e")
    assert "'evil\\x1b]0;pwned\\x07\\x1b[31m[bold]red[/bold]\\x08\\u202e'" in r.stdout
    assert "cfg\\x1b[2J" in r.stdout  # the source path too
    assert json.loads(runner.invoke(app, ["models", str(path), "--json"]).stdout)["name"] == data["_name_or_path"]


def test_models_prints_a_printable_name_as_is(tmp_path):
    data = _q35()
    data["_name_or_path"] = "org/[bold]name[/]"
    r = runner.invoke(app, ["models", str(_write(tmp_path, data))], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0].strip() == "org/[bold]name[/]"


def test_a_control_character_in_model_type_stays_out_of_the_error(tmp_path):
    data = {"model_type": "x\x1b[2J", "num_hidden_layers": 4}
    r = runner.invoke(app, ["models", str(_write(tmp_path, data))])
    assert r.exit_code == 2 and "\x1b" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'config.json'}: not a hybrid GDN model: it has no Gated DeltaNet "
        "(linear_attention) layers"]
