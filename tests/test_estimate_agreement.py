"""`bole calibrate --estimate --gpu h200` against the shipped measured H200 profiles, cell by
cell (docs/design.md §8): the two sources of truth a user may be given must agree. The
estimate's factors come from component microbenchmarks (calibrate/components.py), never
from these profiles, so this is a check, not a fit.

Tolerances: T_dec within 10%, the decided configuration's tokens/s within 15%, the same mode.
A cell outside them is listed in KNOWN_GAPS with its measured figures (experiments/NOTES.md
"The estimate against the measured profiles") and is an expected failure, strict: a fix that
closes it turns the test red until the entry goes.
"""

from __future__ import annotations

import pytest

from bole_cli.calibrate.acceptance import load_acceptance
from bole_cli.calibrate.components import factors
from bole_cli.calibrate.costmodel import H200_MEASURED, RooflineForward
from bole_cli.calibrate.defaults import DEFAULT_GRID
from bole_cli.calibrate.pipeline import sweep_extras
from bole_cli.calibrate.sweep import EXACT, build_profile, run_sweep
from bole_cli.catalog.hardware import resolve_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.profiles import load_profile, shipped_profiles_dir

T_DEC_TOL, TOK_S_TOL = 0.10, 0.15
MODELS = ("Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B")
KNOWN_GAPS: dict[tuple[str, int, int], str] = {}


def _shipped(name):
    return load_profile(shipped_profiles_dir() / "h200" / f"{name}.yaml")


def _cells():
    for name in MODELS:
        for cfg in _shipped(name)["configs"]:
            yield name, cfg["batch"], cfg["kv_len"]


@pytest.fixture(scope="module")
def estimates():
    cache = {}

    def get(name, batch, kv):
        key = (name, batch, kv)
        if key not in cache:
            measured = _shipped(name)
            acc = load_acceptance(measured["acceptance"]["name"])  # the shipped profiles use presets
            spec = resolve_model(measured["model"])
            f = RooflineForward(spec, resolve_gpu("h200"))
            sweep = run_sweep(f, [batch], [kv], DEFAULT_GRID, EXACT, extras=sweep_extras(acc))
            profile, _ = build_profile(gpu_key="h200", model_name=measured["model"], kind="estimated", sweep=sweep,
                                       grid=DEFAULT_GRID, eps=measured["eps"], acceptance=acc, device_name="model")
            cache[key] = profile["configs"][0]
        return cache[key]
    return get


@pytest.mark.parametrize("name, batch, kv", [
    pytest.param(*c, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[c])) if c in KNOWN_GAPS else c
    for c in _cells()])
def test_estimate_agrees_with_the_measured_profile(estimates, name, batch, kv):
    measured = next(c for c in _shipped(name)["configs"] if (c["batch"], c["kv_len"]) == (batch, kv))
    est = estimates(name, batch, kv)
    t_ratio = est["t_dec"] / measured["t_dec"]
    m_dec, e_dec = measured["decision"]["chosen"], est["decision"]["chosen"]
    tok_ratio = e_dec["tok_s"] / m_dec["tok_s"]
    assert abs(t_ratio - 1) <= T_DEC_TOL, f"T_dec estimated {est['t_dec']:.5f} s, measured {measured['t_dec']:.5f} s"
    assert abs(tok_ratio - 1) <= TOK_S_TOL, f"tokens/s estimated {e_dec['tok_s']}, measured {m_dec['tok_s']}"
    assert e_dec["mode"] == m_dec["mode"], f"estimate decides {e_dec['label']}, measurement {m_dec['label']}"


def test_h200_factors_are_the_component_records():
    """costmodel.H200_MEASURED re-derived from the committed component and step records."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments" / "results"
    comp = json.loads((root / "components" / "h200-9b.json").read_text())
    steps = json.loads((root / "runtime" / "steps-h200.json").read_text())
    got = factors(comp, steps, resolve_gpu("h200").bf16_flops)
    for key, value in got.items():
        assert H200_MEASURED[key] == pytest.approx(value, rel=0.05), key
