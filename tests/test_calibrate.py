"""Calibration: Eq. 12 selection, N*, acceptance models, the roofline cost model, the sweep
driver (with a fake StepTimer) and the `bole calibrate` command, all on CPU."""

from __future__ import annotations

import itertools
import json
import random
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.calibrate.acceptance import (PRESET_TARGETS, AcceptanceModel, from_data,
                                           load_acceptance, preset, rank_matrix)
from bole_cli.calibrate.costmodel import RooflineForward
from bole_cli.calibrate.selection import select_b_ver
from bole_cli.calibrate.defaults import DEFAULT_GRID
from bole_cli.calibrate.sweep import (EXACT, StepTimer, Timing, build_profile, measure, run_sweep,
                                      sweep_steps)
from bole_cli.catalog.hardware import resolve_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.errors import InputError
from bole_cli.profiles import load_profile, validate_profile

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

GRID = [8, 16, 32, 64, 128, 256, 512, 1024]


# ---- Eq. 12 on synthetic curves --------------------------------------------------------------
def test_b_ver_monotone_curve():
    t_dec = 10.0
    t_ver = [t_dec * (1 + n / 1000) for n in GRID]  # crosses 1.05 between 32 and 64
    b = select_b_ver(GRID, t_ver, t_dec, 0.05)
    assert (b.b_ver, b.below_threshold) == (32, False)
    assert select_b_ver(GRID, t_ver, t_dec, 0.2).b_ver == 128


def test_b_ver_flat_then_rising():
    t_dec = 5.0
    t_ver = [5.1 if n <= 128 else 5.1 * n / 128 for n in GRID]
    assert select_b_ver(GRID, t_ver, t_dec, 0.05).b_ver == 128
    # exactly on the threshold counts as within it
    assert select_b_ver(GRID, [5.25] * len(GRID), t_dec, 0.05).b_ver == 1024


@pytest.mark.parametrize("seed", range(20))
def test_b_ver_noisy_curve_ignores_a_late_dip(seed):
    rng = random.Random(seed)
    t_dec = 1.0
    t_ver = [(1.0 + rng.uniform(-0.03, 0.03)) if n <= 128 else n / 128 * 1.02 for n in GRID]
    t_ver[GRID.index(512)] = 1.0  # a lucky outlier far past the knee
    b = select_b_ver(GRID, t_ver, t_dec, 0.05)
    assert b.b_ver == 128
    assert t_ver[GRID.index(b.b_ver)] <= 1.05


def test_b_ver_never_under_threshold_is_smallest_point_with_warning():
    t_dec = 1.0
    t_ver = [1.2 * (1 + n / 100) for n in GRID]
    b = select_b_ver(GRID, t_ver, t_dec, 0.05)
    assert (b.b_ver, b.below_threshold) == (8, True)
    curve = run_sweep(_Fake(lambda b, kv: 1.0, lambda b, kv, n: 1.3), [1], [1024], GRID, EXACT)
    profile, warnings = build_profile(gpu_key="a100", model_name="m", kind="measured",
                                      sweep=curve, grid=GRID, eps=0.05, acceptance=None,
                                      device_name="fake")
    assert profile["configs"][0]["below_threshold"] is True
    assert profile["configs"][0]["b_ver"] == 8
    assert warnings == ["1 of 1 cells (!): no grid point within (1 + 0.05) x T_dec"]


@given(st.lists(st.floats(0.5, 3.0), min_size=1, max_size=12), st.floats(0.01, 0.5))
def test_b_ver_never_exceeds_the_threshold(ratios, eps):
    n = [8 * (i + 1) for i in range(len(ratios))]
    b = select_b_ver(n, ratios, 1.0, eps)
    i = n.index(b.b_ver)
    if b.below_threshold:
        assert b.b_ver == n[0] and ratios[0] > 1 + eps
    else:
        assert all(r <= 1 + eps for r in ratios[: i + 1])
        assert i + 1 == len(n) or max(ratios[: i + 2]) > 1 + eps


def test_select_b_ver_rejects_bad_arguments():
    with pytest.raises(ValueError):
        select_b_ver([8, 16], [1.0], 1.0, 0.05)
    with pytest.raises(ValueError):
        select_b_ver([8], [1.0], 1.0, 0.0)


# ---- acceptance models -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESET_TARGETS))
def test_presets_reproduce_the_paper_mean_accepted_tokens(name):
    assert preset(name).per_request(128) == pytest.approx(PRESET_TARGETS[name], abs=0.02)


def test_acceptance_is_increasing_and_concave():
    m = preset("paper-mbpp")
    e = [m.per_request(n) for n in range(1, 400)]
    assert e[0] == 1.0
    inc = [b - a for a, b in zip(e, e[1:])]
    assert all(d >= 0 for d in inc)
    assert all(b <= a + 1e-12 for a, b in zip(inc, inc[1:]))
    assert e[-1] <= 9.0  # depth 8 plus the bonus token


def test_batch_acceptance_shares_the_budget():
    m = preset("paper-gsm8k")
    assert m.batch(7, 8) is None
    assert m.batch(8, 8) == pytest.approx(8.0)
    for b in (1, 2, 4, 8, 16):
        for per in (1, 3, 16):
            assert m.batch(b * per, b) == pytest.approx(b * m.per_request(per))
    # between multiples the extra drafts go to some requests only
    assert 8 * m.per_request(2) < m.batch(20, 8) < 8 * m.per_request(3)


def test_acceptance_matches_the_batch_budget_selector():
    """The closed form equals selecting the best N nodes of explicit trees (bole_cli.budget)."""
    from bole_cli.budget import expected_accepted_curve
    from bole_cli.trees import ProposalTree
    import math

    q = rank_matrix([0.8, 0.7, 0.6], top_k=2)
    parents, logp, frontier = [-1], [0.0], [(0, 0)]
    for depth in range(3):
        nxt = []
        for node, _ in frontier:
            for r in range(2):
                parents.append(node)
                logp.append(math.log(q[depth][r]))
                nxt.append((len(parents) - 1, depth + 1))
        frontier = nxt
    tree = ProposalTree(parents, logp)
    model = AcceptanceModel("t", "", q=q)
    budgets = [2, 3, 4, 6, 9, 15]
    got = expected_accepted_curve([tree, tree], budgets)
    assert got == pytest.approx([model.batch(n, 2) for n in budgets])


def test_acceptance_files(tmp_path):
    per_depth = tmp_path / "a.yaml"
    per_depth.write_text("name: mine\nper_depth: [0.9, 0.8, 0.7]\ntop_k: 2\n")
    m = load_acceptance(str(per_depth))
    assert m.name == "mine" and len(m.q) == 3 and len(m.q[0]) == 2
    assert m.per_request(2) == pytest.approx(1.9)
    curve = tmp_path / "c.json"
    curve.write_text(json.dumps({"curve": {"n": [2, 4, 8], "e_acc": [1.8, 2.6, 3.0]}}))
    c = load_acceptance(str(curve))
    assert c.per_request(1) == 1.0 and c.per_request(3) == pytest.approx(2.2)
    assert c.per_request(100) == 3.0
    assert c.batch(24, 8) == pytest.approx(8 * 2.2)
    matrix = from_data({"per_depth_rank": [[0.5, 0.3], [0.4, 0.2]]}, "m.yaml")
    assert matrix.per_request(3) == pytest.approx(1.8)


@pytest.mark.parametrize("data, field", [
    ({"per_depth": [0.9, 1.5]}, "per_depth[1]"),
    ({"per_depth": "high"}, "per_depth"),
    ({"per_depth_rank": [[0.7, 0.5]]}, "sum above 1"),
    ({"curve": {"n": [4, 2], "e_acc": [2, 3]}}, "curve.n"),
    ({"curve": {"n": [2, 4], "e_acc": [3, 2]}}, "curve.e_acc"),
    ({"per_depth": [0.9], "curve": {}}, "exactly one"),
    ([0.9, 0.8], "expected a mapping"),
])
def test_acceptance_file_errors_name_the_field(data, field):
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_data(data, "acc.yaml")


def test_unknown_acceptance_is_an_input_error():
    with pytest.raises(InputError, match="--acceptance"):
        load_acceptance("paper-nothing")


# ---- the roofline model ------------------------------------------------------------------------
def _estimated_entry(gpu: str, model: str, batch: int, kv: int) -> dict:
    from bole_cli.calibrate.pipeline import sweep_extras

    acc = preset("paper-mbpp")
    f = RooflineForward(resolve_model(model), resolve_gpu(gpu))
    sweep = run_sweep(f, [batch], [kv], DEFAULT_GRID, EXACT, extras=sweep_extras(acc))
    profile, _ = build_profile(gpu_key=gpu, model_name=model, kind="estimated", sweep=sweep,
                               grid=DEFAULT_GRID, eps=0.05, acceptance=acc, device_name="model")
    return profile["configs"][0]


@pytest.mark.parametrize("kv", [1024, 4096, 16384])
def test_estimates_land_near_the_papers_budget_knees_for_9b_batch_8(kv):
    """The paper's knees (128 tree tokens on A100, 256 on GB10) are a check here, not an
    input: no efficiency factor is fitted to them (costmodel.EFFICIENCY). Tolerance: one
    doubling either way, for B_ver (the paper's rule) and for the decided tree's budget."""
    a100, gb10 = _estimated_entry("a100", "9b", 8, kv), _estimated_entry("gb10", "9b", 8, kv)
    for entry, knee in ((a100, 128), (gb10, 256)):
        assert knee / 2 <= entry["b_ver"] <= knee * 2
        assert knee / 2 <= entry["n_star"] <= knee * 2
    assert gb10["n_star"] > a100["n_star"]


def test_roofline_curve_is_flat_then_compute_bound():
    f = RooflineForward(resolve_model("9b"), resolve_gpu("a100"))
    t_dec = f.time_decode(8, 4096)
    t = [f.time_verify(8, 4096, n) for n in DEFAULT_GRID]
    assert all(b >= a for a, b in zip(t, t[1:]))
    assert t[0] < 1.05 * t_dec  # a tree of one token per request costs about a decode
    assert t[-1] / t[DEFAULT_GRID.index(512)] > 1.8  # far past the knee: ~linear in N
    assert f.time_decode(8, 16384) > f.time_decode(8, 1024)  # KV reads count


def test_roofline_moe_reads_only_touched_experts():
    m = resolve_model("35b")
    f = RooflineForward(m, resolve_gpu("h200"))
    one = f.components(1, 1024, 1, verify=False)["matmul.mlp"]
    many = f.components(64, 1024, 64, verify=False)["matmul.mlp"]
    # 1 token touches 8 of 256 experts; 64 tokens touch about 256 * (1 - (1 - 8/256)^64) = 223
    assert 10 < many / one < 256 / 8 + 1


def test_the_estimate_reports_a_step_beyond_the_gpus_memory_as_the_runtime_would():
    """A cell whose step needs more than the datasheet's memory fails in the sweep, as the
    measured runtime's memory check makes it fail on the GPU, instead of being priced: 27B
    on an 80 GB A100 at batch 16, kv 16384 decodes (its KV is 16 GiB) but no 768-token tree
    fits beside it; kv 10M does not even decode."""
    from bole_cli.calibrate.pipeline import sweep_extras
    from bole_cli.errors import BoleError
    from bole_cli.footprint import step_memory

    spec, gpu = resolve_model("27b"), resolve_gpu("a100")
    f = RooflineForward(spec, gpu, check_memory=True)
    need = f.memory(16, 16384, 768)
    assert need["total"] > gpu.memory_bytes > f.memory(16, 16384)["total"]
    # the verify adds the draft head and its cache to the runtime's own step
    target = step_memory(spec, 2, 4, batch=16, kv_len=16384, n_tree_tokens=768)["total"]
    assert need["total"] == target + need["draft_head"] + need["draft_kv"] > target
    with pytest.raises(BoleError, match=r"does not fit for batch 16, kv_len 16384, 768 tree tokens: needs .*"
                                        r"available on one A100"):
        f.time_verify(16, 16384, 768)
    assert RooflineForward(spec, gpu).time_verify(16, 16384, 768) > 0  # priced where not asked to check
    acc = preset("paper-mbpp")
    res = run_sweep(f, [1, 16], [16384, 10_000_000], DEFAULT_GRID, EXACT, extras=sweep_extras(acc))
    assert [(c.batch, c.kv_len) for c in res.curves] == [(1, 16384), (16, 16384)]
    assert max(res.curves[1].n) < 768 and res.curves[1].draft_level and res.curves[1].sample
    assert [f.split(":")[0] for f in res.failures] == ["batch 16, kv 16384, N 768", "batch 1, kv 10000000, decode",
                                                       "batch 16, kv 10000000, decode"]


# ---- the sweep driver with a fake StepTimer ------------------------------------------------------
class _Fake:
    def __init__(self, dec, ver, interrupt_after=None):
        self.dec, self.ver = dec, ver
        self.calls = 0
        self.interrupt_after = interrupt_after
        self.device_name = "Fake GPU"

    def _tick(self):
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt

    def time_decode(self, batch, kv_len):
        self._tick()
        return self.dec(batch, kv_len)

    def time_verify(self, batch, kv_len, n_tree_tokens):
        self._tick()
        return self.ver(batch, kv_len, n_tree_tokens)

    def info(self):
        return {"sampled_layers": [0, 3], "graphs": True}

    def time_draft_level(self, batch, kv_len, rows):
        return 0.001 * (1 + 0.01 * batch * rows)

    def time_sample(self, batch, tokens):
        return 1e-4 + 1e-7 * tokens


def test_fake_forward_satisfies_the_protocol():
    assert isinstance(_Fake(None, None), StepTimer)
    assert isinstance(RooflineForward(resolve_model("4b"), resolve_gpu("a100")), StepTimer)


def test_measure_warms_up_and_takes_the_median():
    values = iter([100.0, 100.0, 3.0, 1.0, 2.0, 50.0, 2.0])
    calls = []
    p = measure(lambda: calls.append(1) or next(values), Timing(warmup=2, repeats=5, spread_tol=100))
    assert len(calls) == 7 and p.seconds == 2.0 and not p.noisy


def test_measure_remeasures_noisy_points():
    rounds = [[1.0, 2.0, 1.0, 2.0], [1.0, 1.01, 1.0, 1.01]]
    values = iter(rounds[0] + rounds[1])
    p = measure(lambda: next(values), Timing(warmup=0, repeats=4, spread_tol=0.10, max_rounds=3))
    assert p.seconds == pytest.approx(1.005) and not p.noisy
    calls = []
    alternating = itertools.cycle([1.0, 2.0])
    p = measure(lambda: calls.append(1) or next(alternating),
                Timing(warmup=0, repeats=8, max_rounds=3))
    assert p.noisy and len(calls) == 24  # three rounds, then kept and flagged


def test_sweep_covers_every_configuration_and_feasible_point():
    steps = []
    fake = _Fake(lambda b, kv: 1.0 + kv / 1e5, lambda b, kv, n: 1.0 + kv / 1e5 + n / 1e3)
    res = run_sweep(fake, [1, 16], [1024, 4096], [8, 16, 32], EXACT, on_step=steps.append)
    assert not res.interrupted
    assert [(c.batch, c.kv_len) for c in res.curves] == [(1, 1024), (16, 1024), (1, 4096), (16, 4096)]
    assert res.curves[1].n == [16, 32]  # 8 tree tokens cannot hold 16 roots
    # per kv: decode + points of each batch (4 + 3), and each configuration's sample line (2)
    assert len(steps) == sweep_steps([1, 16], [1024, 4096], [8, 16, 32], forward=fake) == 2 * (4 + 3 + 2 * 2)
    assert all(c.sample is not None and not c.draft_level for c in res.curves)  # draft_rows 0


def test_a_failing_point_ends_its_configuration_only():
    def ver(b, kv, n):
        if b == 2 and n >= 32:
            raise RuntimeError("CUDA out of memory")
        return 1.0 + n / 100

    def dec(b, kv):
        if kv == 4096 and b == 1:
            raise RuntimeError("CUDA out of memory")
        return 1.0

    steps = []
    res = run_sweep(_Fake(dec, ver), [1, 2], [1024, 4096], [8, 16, 32, 64], EXACT,
                    on_step=steps.append)
    assert len(steps) == sweep_steps([1, 2], [1024, 4096], [8, 16, 32, 64], forward=_Fake(dec, ver))
    assert [(c.batch, c.kv_len, c.n) for c in res.curves] == [
        (1, 1024, [8, 16, 32, 64]), (2, 1024, [8, 16]), (2, 4096, [8, 16])]
    assert len(res.failures) == 3 and "out of memory" in res.failures[0]
    profile, warnings = build_profile(gpu_key="h200", model_name="m", kind="measured",
                                      sweep=res, grid=[8, 16, 32, 64], eps=0.05,
                                      acceptance=None, device_name="fake")
    validate_profile(profile, "p.yaml")
    assert len(profile["provenance"]["failures"]) == 3
    assert sum(w.startswith("failed:") for w in warnings) == 3


def test_ctrl_c_keeps_what_was_measured():
    fake = _Fake(lambda b, kv: 1.0, lambda b, kv, n: 1.0 + n / 100, interrupt_after=7)
    res = run_sweep(fake, [1, 2], [1024], [8, 16, 32, 64], EXACT)
    assert res.interrupted
    assert [c.batch for c in res.curves] == [1, 2]
    assert res.curves[0].n == [8, 16, 32, 64] and res.curves[1].n == [8]
    profile, warnings = build_profile(gpu_key="h200", model_name="m", kind="measured",
                                      sweep=res, grid=[8, 16, 32, 64], eps=0.05,
                                      acceptance=preset("paper-mbpp"), device_name="fake")
    validate_profile(profile, "partial.yaml")
    assert profile["provenance"]["partial"] is True
    assert any("partial" in w for w in warnings)


# ---- the command --------------------------------------------------------------------------------
@pytest.fixture
def no_gpu(monkeypatch):
    import bole_cli.catalog.hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)


def _invoke(*args):
    return runner.invoke(cli.app, list(args))


def test_estimate_is_the_default_without_the_gpu(no_gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    r = _invoke("calibrate", "--gpu", "a100", "--model", "27b")
    assert r.exit_code == 0, r.stderr
    assert "ESTIMATED (roofline model, no A100 present" in r.stdout
    assert "B_ver" in r.stdout and "decision" in r.stdout and "runner-up" in r.stdout
    path = tmp_path / "cache" / "bole" / "profiles" / "a100" / "Qwen3.5-27B.yaml"
    profile = load_profile(path)
    assert profile["provenance"]["kind"] == "estimated"
    assert "ESTIMATED" in profile["provenance"]["note"]
    assert len(profile["configs"]) == 15 and profile["kernels"] == {}
    assert path.with_suffix(".png").stat().st_size > 1000


def test_json_output_and_options(no_gpu, tmp_path):
    out = tmp_path / "p.yaml"
    r = _invoke("calibrate", "--gpu", "gb10", "--model", "9b", "--batch", "8,1", "--kv", "4096",
                "--grid", "8,64,128,256,512", "--eps", "0.1", "--acceptance", "paper-gsm8k",
                "--out", str(out), "--no-plot", "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["path"] == str(out) and data["plot"] is None
    assert data["label"].startswith("ESTIMATED")
    prof = data["profile"]
    assert [(c["batch"], c["kv_len"]) for c in prof["configs"]] == [(1, 4096), (8, 4096)]
    assert prof["eps"] == 0.1 and prof["acceptance"]["name"] == "paper-gsm8k"
    assert "--eps 0.1" in prof["provenance"]["command"]
    assert not out.with_suffix(".png").exists()


def test_no_plot_says_the_plot_beside_the_profile_is_an_earlier_runs(no_gpu, tmp_path):
    """A plot beside a profile rewritten with --no-plot shows the earlier profile: a warning
    says so, and the file is left alone (it is the user's)."""
    out = tmp_path / "p.yaml"
    args = ("calibrate", "--gpu", "a100", "--model", "4b", "--batch", "1", "--kv", "1024", "--out", str(out))
    assert _invoke(*args).exit_code == 0 and out.with_suffix(".png").exists()
    r = _invoke(*args, "--no-plot", "--json")
    assert r.exit_code == 0, r.stderr
    assert out.with_suffix(".png").exists()
    assert any("p.png is an earlier run's plot" in w for w in json.loads(r.stdout)["warnings"])
    r = _invoke(*args, "--no-plot")
    assert r.exit_code == 0 and "earlier run's plot" in r.stderr
    out.with_suffix(".png").unlink()
    r = _invoke(*args, "--no-plot", "--json")  # no plot: nothing said
    assert r.exit_code == 0 and not any("p.png" in w for w in json.loads(r.stdout)["warnings"])


def test_rewrite_keeps_the_kernels_section(no_gpu, tmp_path):
    from bole_cli.profiles import merge_section

    out = tmp_path / "p.yaml"
    args = ("calibrate", "--gpu", "a100", "--model", "4b", "--batch", "1", "--kv", "1024",
            "--out", str(out), "--no-plot")
    assert _invoke(*args).exit_code == 0
    merge_section(out, "kernels", {"verify/T64": {"BLOCK": 64}})
    assert _invoke(*args, "--eps", "0.1").exit_code == 0
    p = load_profile(out)
    assert p["kernels"] == {"verify/T64": {"BLOCK": 64}} and p["eps"] == 0.1
    r = _invoke("calibrate", "--gpu", "a100", "--model", "9b", "--out", str(out), "--no-plot")
    assert r.exit_code == 2 and "Qwen/Qwen3.5-4B" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--grid", "8,abc"], "--grid"),
    (["--grid", ""], "--grid"),
    (["--batch", "0"], "--batch"),
    (["--kv", ","], "--kv"),
    (["--eps", "0"], "--eps"),
    (["--eps", "-1"], "--eps"),
    (["--measure", "--estimate"], "--measure"),
    (["--acceptance", "nope"], "--acceptance"),
    (["--grid", "8", "--batch", "16"], "--grid"),
    (["--layers-sample", "0"], "--layers-sample"),
])
def test_bad_input_is_exit_2_naming_the_option(no_gpu, tmp_path, args, needle):
    r = _invoke("calibrate", "--gpu", "a100", "--model", "9b", "--out", str(tmp_path / "x.yaml"),
                "--no-plot", *args)
    assert r.exit_code == 2, r.stdout
    assert needle in r.stderr
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("gpu, model, needle", [("z9000", "9b", "unknown GPU"),
                                                ("a100", "99b", "unknown model")])
def test_unknown_gpu_or_model(no_gpu, gpu, model, needle):
    r = _invoke("calibrate", "--gpu", gpu, "--model", model, "--no-plot")
    assert r.exit_code == 2 and needle in r.stderr


def test_measure_without_the_gpu_is_bad_input(no_gpu, tmp_path):
    r = _invoke("calibrate", "--gpu", "h200", "--model", "9b", "--measure", "--no-plot",
                "--out", str(tmp_path / "x.yaml"))
    assert r.exit_code == 2 and "--measure: no H200 present" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x.yaml").exists()


def _present(monkeypatch, key="h200"):
    import bole_cli.catalog.hardware as hw

    detected = hw.DetectedGpu(name="NVIDIA H200", memory_bytes=141 * 10**9, sm_count=132,
                              compute_capability=(9, 0), spec=hw.resolve_gpu(key))
    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: detected)


def test_measured_path_without_runtime_is_a_clear_error(monkeypatch):
    _present(monkeypatch)
    monkeypatch.setitem(sys.modules, "bole_cli.runtime", None)  # import fails
    monkeypatch.delitem(sys.modules, "bole_cli.runtime.timer", raising=False)
    r = _invoke("calibrate", "--gpu", "h200", "--model", "9b", "--no-plot")
    assert r.exit_code == 1 and "bole_cli.runtime" in r.stderr and "--estimate" in r.stderr


def _fake_runtime(monkeypatch, interrupt_after=None):
    """Stand-in for bole_cli.runtime.timer.HybridForwardTimer (no torch model built)."""
    made = {}

    def timer(spec, device, dtype, layers_sample=None, serving_step=False):
        made["args"] = (spec.name, device, layers_sample)
        made["serving_step"] = serving_step
        return _Fake(lambda b, kv: 0.01 * (1 + kv / 1e5),
                     lambda b, kv, n: 0.01 * (1 + kv / 1e5) * max(1.0, n / 100),
                     interrupt_after=interrupt_after)

    package = types.ModuleType("bole_cli.runtime")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "bole_cli.runtime", package)
    monkeypatch.setitem(sys.modules, "bole_cli.runtime.timer",
                        types.SimpleNamespace(HybridForwardTimer=timer))
    return made


def test_measured_path_runs_the_sweep_through_the_runtime(monkeypatch, tmp_path):
    _present(monkeypatch)
    made = _fake_runtime(monkeypatch)
    out = tmp_path / "h200.yaml"
    r = _invoke("calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1,8", "--kv", "1024",
                "--grid", "8,64,128,256", "--repeats", "3", "--warmup", "1", "--out", str(out),
                "--layers-sample", "2", "--no-plot")
    assert r.exit_code == 0, r.stderr
    assert made["args"] == ("Qwen/Qwen3.5-9B", "cuda:0", 2) and made["serving_step"]
    assert "MEASURED on NVIDIA H200" in r.stdout
    p = load_profile(out)
    assert p["provenance"]["kind"] == "measured" and p["provenance"]["partial"] is False
    assert p["provenance"]["sampled_layers"] == [0, 3]
    assert p["provenance"]["timing"]["repeats"] == 3
    assert p["provenance"]["device_name"] == "Fake GPU"
    cfg = {(c["batch"], c["kv_len"]): c for c in p["configs"]}
    # 0.01 flat up to N = 100, then linear; the chains' sizes (8 x 2 .. 8 x 9) are measured too
    assert cfg[(8, 1024)]["b_ver"] == 72 and 72 in cfg[(8, 1024)]["n"]
    assert 512 not in cfg[(1, 1024)]["n"]  # beyond the largest tree of one request
    d = cfg[(8, 1024)]["decision"]  # the fake's drafter and sampling were priced
    assert d["chosen"]["t_draft"] > 0 and d["best"]["none"]["speedup"] == pytest.approx(1.0)


def test_measured_ctrl_c_writes_a_partial_profile(monkeypatch, tmp_path):
    _present(monkeypatch)
    _fake_runtime(monkeypatch, interrupt_after=7)
    out = tmp_path / "h200.yaml"
    r = _invoke("calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1,8", "--kv", "1024",
                "--grid", "8,64,128,256", "--repeats", "1", "--warmup", "0", "--out", str(out),
                "--no-plot")
    assert r.exit_code == 130
    assert "partial" in r.stderr
    p = load_profile(out)
    assert p["provenance"]["partial"] is True and p["provenance"]["kind"] == "measured"
    assert 1 <= len(p["configs"]) <= 2


def test_a_partial_profile_goes_beside_an_earlier_one(monkeypatch, tmp_path):
    """Ctrl-C with a profile of an earlier run at --out: the partial sweep is written as
    NAME-partial.yaml, the earlier profile and its plot kept."""
    _present(monkeypatch)
    _fake_runtime(monkeypatch)
    out = tmp_path / "h200.yaml"
    args = ("calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1,8", "--kv", "1024",
            "--grid", "8,64,128,256", "--repeats", "1", "--warmup", "0", "--out", str(out))
    assert _invoke(*args).exit_code == 0 and out.with_suffix(".png").exists()
    earlier = out.read_bytes()
    _fake_runtime(monkeypatch, interrupt_after=7)
    r = _invoke(*args, "--no-plot")
    assert r.exit_code == 130 and "h200-partial.yaml" in " ".join(r.stderr.split())
    assert out.read_bytes() == earlier and out.with_suffix(".png").exists()
    assert load_profile(tmp_path / "h200-partial.yaml")["provenance"]["partial"] is True


def test_estimate_flag_on_the_present_gpu(monkeypatch, tmp_path):
    _present(monkeypatch)
    monkeypatch.setitem(sys.modules, "bole_cli.runtime", None)
    r = _invoke("calibrate", "--gpu", "h200", "--model", "4b", "--estimate", "--batch", "1",
                "--kv", "1024", "--out", str(tmp_path / "e.yaml"), "--no-plot")
    assert r.exit_code == 0, r.stderr
    assert "ESTIMATED (roofline model, --estimate)" in r.stdout


def test_the_real_runtime_timer_drives_the_sweep_on_cpu():
    """Interface check against bole_cli.runtime (tiny model, CPU, eager): the timer is a
    StepTimer and its curves make a valid profile."""
    torch = pytest.importorskip("torch")
    timer_mod = pytest.importorskip("bole_cli.runtime.timer")
    from bole_cli.runtime.model import tiny_spec

    from bole_cli.calibrate.measured import MeasuredForward
    from bole_cli.calibrate.sweep import Extras

    timer = MeasuredForward(timer_mod.HybridForwardTimer(tiny_spec(), "cpu", torch.float32,
                                                         serving_step=True))
    assert isinstance(timer, StepTimer)
    res = run_sweep(timer, [1, 2], [16], [2, 4], Timing(warmup=1, repeats=2, max_rounds=1),
                    extras=Extras(per_request_cap=4, chain_depth=1, draft_rows=2))
    assert not res.failures and [c.n for c in res.curves] == [[2, 4], [2, 4]]
    assert all(len(c.draft_level) == 2 and c.sample is not None for c in res.curves)
    profile, _ = build_profile(gpu_key="cpu", model_name="tiny", kind="measured", sweep=res,
                               grid=[2, 4], eps=0.05, acceptance=preset("paper-mbpp"),
                               device_name=timer.device_name,
                               extra_provenance={"sampled_layers": timer.info()["sampled_layers"]})
    validate_profile(profile, "tiny.yaml")


def test_the_measured_forward_holds_no_drafter_beside_a_verify():
    """The drafters, their cache and the sample's logits of one configuration are dropped
    before the next decode or verify (the biggest verify must not pay for them), and a head
    rebuilt after that has the same weights."""
    torch = pytest.importorskip("torch")
    timer_mod = pytest.importorskip("bole_cli.runtime.timer")
    from bole_cli.runtime.model import tiny_spec

    from bole_cli.calibrate.measured import MeasuredForward

    fwd = MeasuredForward(timer_mod.HybridForwardTimer(tiny_spec(), "cpu", torch.float32, serving_step=True))
    fwd.time_draft_level(1, 16, 2)
    fwd.time_sample(1, 4)
    weights = {k: v.clone() for k, v in fwd._drafter(2).w.items()}
    assert fwd._drafters and fwd._graphs and fwd._logits
    fwd.time_verify(1, 16, 2)
    assert not fwd._drafters and not fwd._graphs and not fwd._logits
    fwd.time_draft_level(1, 16, 2)
    fwd.time_decode(1, 16)
    assert not fwd._drafters and not fwd._graphs
    assert all(torch.equal(fwd._drafter(2).w[k], w) for k, w in weights.items())


def fit_preset_a1(target: float, lo: float = 0.05, hi: float = 0.9999) -> float:
    """Top-1 acceptance at depth 1 that makes the beam tree (depth 8, top-k 4) at budget
    128 commit `target` tokens per step, by bisection (how the presets were made)."""
    from bole_cli.calibrate import acceptance as acc

    def e(a: float) -> float:
        return acc.AcceptanceModel("fit", "", q=acc.preset_rows(a)).per_request(acc.PAPER_BUDGET)

    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if e(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def test_presets_are_fitted_to_the_papers_accepted_lengths():
    """Each preset's depth-1 top-1 acceptance is the fit that makes the beam tree of depth 8,
    top-k 4 at budget 128 commit the paper's mean accepted length."""
    from bole_cli.calibrate import acceptance as acc

    for name, target in acc.PRESET_TARGETS.items():
        assert abs(fit_preset_a1(target) - acc.preset_top1(name)) < 5e-5, name


def test_h200_factors_derive_from_the_component_records():
    """The H200's efficiency factors in the code are the committed component and step
    records' (calibrate.components), to their rounding, and physically plausible."""
    from pathlib import Path

    from bole_cli.calibrate.components import FACTOR_NAMES, H200_RECORDS, code_factors, factors

    root = Path(__file__).resolve().parents[1] / "experiments" / "results"
    read = lambda rel: json.loads((root / rel).read_text())  # noqa: E731
    got = factors(read(H200_RECORDS["components"]), [read(rel) for rel in H200_RECORDS["steps"]],
                  read(H200_RECORDS["tree_kernels"]), resolve_gpu("h200").bf16_flops)
    code = code_factors()
    assert tuple(got) == FACTOR_NAMES == tuple(code)
    flat = lambda v: [x for cell in v for x in cell] if isinstance(v, (tuple, list)) else [v]  # noqa: E731
    for name, value in got.items():
        assert flat(code[name]) == pytest.approx(flat(value), rel=0.02), name
    assert 0.5 < got["bw"] <= 1.0 and 0.4 < got["flops"] <= 1.0
    assert 1e-7 < got["gap_s"] < 5e-6 and 1e-6 < got["kernel_floor_s"] < 1e-5 and 0 < got["host_step_s"] < 1e-3
    assert got["decode_launches_per_layer"] < got["verify_launches_per_layer"]
    cells = got["gdn_tree_cells"]
    assert len(cells) == 24 and all(0.05 < share <= 1.0 for _, _, share in cells)
    assert len({(b, n) for b, n, _ in cells}) == len({b for b, _, _ in cells}) * len({n for _, n, _ in cells})
    assert all(0.8 < y < 2.0 for _, y in got["gemm_knee"]) and got["gemm_knee"][0][1] == 1.0


def test_h200_decode_launches_go_by_rows():
    """A one-row decode launches the one-row count (its skinny projections fuse the add +
    RMSNorm), a decode of more rows the other; a verify's launches do not depend on its rows."""
    from bole_cli.limits import SKINNY_DEFAULT_MAX_ROWS

    m = resolve_model("9b")
    f = RooflineForward(m, resolve_gpu("h200"))
    r = f.eff.runtime
    one, more = SKINNY_DEFAULT_MAX_ROWS, SKINNY_DEFAULT_MAX_ROWS + 1
    step = f.eff.kernel_floor_s + r.gap_s  # an unpriced launch's cost
    extra = f.components(more, 1024, more, False)["launch"] - f.components(one, 1024, one, False)["launch"]
    assert r.rows_decode_launches_per_layer > r.decode_launches_per_layer
    assert extra == pytest.approx(m.layers * (r.rows_decode_launches_per_layer - r.decode_launches_per_layer) * step)
    assert f.components(one, 1024, 32, True)["launch"] == f.components(more, 1024, 32, True)["launch"]


def test_multi_row_decode_launches_come_from_their_own_profiles():
    """components.factors: a production decode profiled at more than one row sets the
    multi-row count (and stays out of the one-row count); without one, the cuBLAS step's;
    without either, the one-row count."""
    import copy
    from pathlib import Path

    from bole_cli.calibrate.components import factors

    root = Path(__file__).resolve().parents[1] / "experiments" / "results"
    comp = json.loads((root / "components" / "h200-9b-r14.json").read_text())
    grid = json.loads((root / "components" / "h200-9b-gdn-grid.json").read_text())
    step = json.loads((root / "runtime" / "r15" / "steps-h200.json").read_text())
    peak = resolve_gpu("h200").bf16_flops
    layers = resolve_model("9b").layers
    base = factors(comp, [step], grid, peak)
    more = copy.deepcopy(step)
    one = next(p for p in more["profile"] if p["variant"] == "production" and p["step"] == "decode")
    more["profile"].append(dict(one, batch=16, kernels=13 * layers))
    got = factors(comp, [more], grid, peak)
    assert got["rows_decode_launches_per_layer"] == pytest.approx(13.0)
    assert got["decode_launches_per_layer"] == base["decode_launches_per_layer"]
    assert base["rows_decode_launches_per_layer"] == pytest.approx(373 / layers)  # R-15's cuBLAS step
    bare = copy.deepcopy(step)
    bare["profile"] = [p for p in bare["profile"] if p["variant"] == "production"]
    got = factors(comp, [bare], grid, peak)
    assert got["rows_decode_launches_per_layer"] == got["decode_launches_per_layer"]


def test_gdn_tree_share_interpolates_between_measured_cells():
    """The estimate's GDN verify + commit share: each measured cell exactly, in between
    log-linear in batch and nodes, clamped outside the grid."""
    f = RooflineForward(resolve_model("9b"), resolve_gpu("h200"))
    cells = {(b, n): share for b, n, share in f.eff.gdn_tree_cells}
    assert all(f._gdn_share(int(b), n) == pytest.approx(share) for (b, n), share in cells.items())
    mid = f._gdn_share(8, 8)  # halfway between batch 4 and 16 in log2
    assert mid == pytest.approx(0.5 * (cells[(4.0, 8.0)] + cells[(16.0, 8.0)]))
    assert f._gdn_share(1, 0.5) == pytest.approx(cells[(1.0, 2.0)])
    assert f._gdn_share(256, 512) == pytest.approx(cells[(64.0, 64.0)])


def test_gdn_decode_share_derives_from_its_rows_and_prices_the_decode():
    """components.gdn_decode_cells: a decode's GDN layer measured at twice its roofline's
    time gives a share of 0.5; with those cells a decode's GDN layers cost twice what the bare
    roofline prices, in between batches log-interpolated, a verify untouched; a record
    without the rows gives none."""
    import dataclasses

    from bole_cli.calibrate.components import gdn_decode_cells
    from bole_cli.calibrate.costmodel import EFFICIENCY

    spec, gpu = resolve_model("9b"), resolve_gpu("h200")
    bare = dataclasses.replace(EFFICIENCY["h200"], gdn_decode_cells=())
    roof = RooflineForward(spec, gpu, bare)
    layer = {b: roof.components(b, 4096, b, verify=False)["gdn_core"] / spec.n_gdn_layers for b in (1, 16)}
    record = {"model": spec.name, "gdn_decode": [{"batch": 16, "us": 4e6 * layer[16]},
                                                   {"batch": 1, "us": 2e6 * layer[1]},
                                                   {"batch": 1, "value_split": 4, "us": 1e6 * layer[1]},
                                                   {"batch": 1, "value_split": 1, "num_warps": 4, "us": 1e6 * layer[1]},
                                                   {"batch": 16, "impl": "sglang", "us": 1e6 * layer[16]},
                                                   {"batch": 16, "variant": "d-no-norm", "us": 1e6 * layer[16]}]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("bole_cli.limits.GDN_DECODE_LAUNCH", ((None, 1, 8),))
        cells = gdn_decode_cells(record)  # the rule's launch (one program of 8 warps a head) only
        assert cells == ((1.0, 0.5), (16.0, 0.25))
        mp.setattr("bole_cli.limits.GDN_DECODE_LAUNCH", ((32, 4, 2), (None, 1, 8)))  # another rule: its rows
        assert gdn_decode_cells(record) == ((1.0, 1.0), (16.0, 0.25))
    assert gdn_decode_cells({"model": spec.name}) == ()
    shared = RooflineForward(spec, gpu, dataclasses.replace(bare, gdn_decode_cells=cells))
    for b, share in ((1, 0.5), (16, 0.25)):
        got, want = (f.components(b, 4096, b, verify=False)["gdn_core"] for f in (shared, roof))
        assert got == pytest.approx(want / share)
    mid = shared.components(4, 4096, 4, verify=False)["gdn_core"] / roof.components(4, 4096, 4, verify=False)["gdn_core"]
    assert mid == pytest.approx(1 / 0.375)  # halfway between batch 1 and 16 in log2
    assert (shared.components(4, 4096, 64, verify=True)["gdn_core"]
            == pytest.approx(roof.components(4, 4096, 64, verify=True)["gdn_core"]))


def test_the_decode_launch_rule_derives_from_the_fastest_rows():
    """components.gdn_decode_launch_rows: by head count (batch x value heads, across models)
    the fastest of our launches, SGLang's rows and kernel variants left out, a step between
    two counts at their geometric mean, equal neighbours merged and the last row open."""
    from bole_cli.calibrate.components import gdn_decode_launch_rows

    def rows(model, batch, *launches):  # (split, warps, us)
        return [{"batch": batch, "value_split": s, "num_warps": w, "us": us} for s, w, us in launches]

    nine = {"model": "9b", "gdn_decode": rows("9b", 1, (1, 8, 10.0), (16, 1, 6.0)) + rows("9b", 4, (16, 1, 9.0))
            + rows("9b", 16, (16, 1, 30.0), (4, 2, 25.0)) + [{"batch": 16, "impl": "sglang", "us": 1.0}]
            # an experiment's variant of the kernel (kernel_variants.py), however fast, is not a launch
            + [{"batch": 16, "variant": "d-no-norm", "value_split": 8, "num_warps": 2, "us": 1.0}]}
    big = {"model": "27b", "gdn_decode": [{"batch": 1, "value_split": 8, "us": 7.0}]}  # 48 heads, warps 8 // 8
    assert gdn_decode_launch_rows([nine]) == ((int((128 * 512) ** 0.5), 16, 1), (None, 4, 2))
    assert gdn_decode_launch_rows([nine, big]) == ((int((32 * 48) ** 0.5), 16, 1), (int((48 * 128) ** 0.5), 8, 1),
                                                   (int((128 * 512) ** 0.5), 16, 1), (None, 4, 2))
    assert gdn_decode_launch_rows([{"model": "9b"}]) == ()
    # a launch timed in several records counts by its median: one lucky repeat does not win
    again = {"model": "9b", "gdn_decode": rows("9b", 1, (16, 1, 20.0), (1, 8, 10.0))}
    third = {"model": "9b", "gdn_decode": rows("9b", 1, (16, 1, 12.0), (1, 8, 10.0))}
    assert gdn_decode_launch_rows([nine, again, third])[0][1:] == (1, 8)
    # a launch within 1% of the fastest at a count keeps the rule on the launch below it
    tie = {"model": "9b", "gdn_decode": rows("9b", 1, (4, 2, 10.0), (8, 2, 12.0))
           + rows("9b", 16, (4, 2, 30.2), (8, 2, 30.0)) + rows("9b", 64, (4, 2, 90.0), (8, 2, 80.0))}
    assert gdn_decode_launch_rows([tie]) == ((int((512 * 2048) ** 0.5), 4, 2), (None, 8, 2))


def test_the_shipped_decode_launch_rule_is_the_records():
    """limits.GDN_DECODE_LAUNCH is what calibrate.components.gdn_decode_launch_rows derives
    from the committed decode sweeps (experiments/README.md S8-a, S8-d, S9-a, S9-e on H100s,
    S9-g on the H200), each device's records alone."""
    from pathlib import Path

    from bole_cli.calibrate.components import gdn_decode_launch_rows
    from bole_cli.limits import GDN_DECODE_LAUNCH

    root = Path(__file__).resolve().parents[1] / "experiments" / "results" / "components"
    records = [json.loads((root / f"{name}.json").read_text())
               for name in ("h100-9b-decode-s8", "h100-9b-decode-s8-repeat", "h100-27b-decode-s8",
                            "h100-9b-decode-variants-s9", "h100-27b-decode-variants-s9", "h200-9b-decode-s9",
                            "h200-27b-decode-s9")]
    # one device's records at a time (medians across two devices would mix their speeds)
    assert gdn_decode_launch_rows(records[:-2]) == GDN_DECODE_LAUNCH  # the H100's
    assert gdn_decode_launch_rows(records[-2:]) == GDN_DECODE_LAUNCH  # the H200's


def test_attention_share_derives_from_its_rows_and_prices_the_attention():
    """components.attention_cells: a layer's attention measured at twice its roofline's time
    gives 0.5, two (batch, cache length) pairs reading as many keys take their median; with
    the cells the estimate's attention (the target's and the drafter's) costs its roofline
    over the share, in between keys log-interpolated, the other components untouched; a
    record without rows gives none."""
    import dataclasses

    from bole_cli.calibrate.components import attention_cells
    from bole_cli.calibrate.costmodel import EFFICIENCY

    spec, gpu = resolve_model("9b"), resolve_gpu("h200")
    bare = dataclasses.replace(EFFICIENCY["h200"], attention_cells=())
    roof = RooflineForward(spec, gpu, bare)

    def layer(b, kv, n):
        return roof.components(b, kv, b * n, verify=n > 1)["attention"] / spec.n_attention_layers

    rows = [{"batch": b, "kv": kv, "tokens": n, "us": f * 1e6 * layer(b, kv, n)}
            for b, kv, n, f in ((1, 1024, 1, 2.0), (1, 1024, 32, 2.0), (1, 16384, 1, 4.0), (1, 16384, 32, 4.0),
                                (16, 1024, 1, 1.0), (16, 1024, 32, 2.0))]
    swept = [{**rows[0], "us": 1.0, "launch": [64, 4, 2, 264, 256]}, {**rows[0], "us": 1.0, "variant": "a-before-s9"}]
    cells = attention_cells({"model": spec.name, "attention": rows + swept})  # a sweep's other launches: not used
    assert cells == ((1024.0, 4.0, 0.5), (1024.0, 128.0, 0.5), (16384.0, 4.0, 0.625), (16384.0, 128.0, 0.375))
    assert attention_cells({"model": spec.name}) == ()
    shared = RooflineForward(spec, gpu, dataclasses.replace(bare, attention_cells=cells))
    for b, kv, n, share in ((1, 1024, 32, 0.5), (16, 1024, 1, 0.625), (1, 16384, 32, 0.375)):
        got, want = (f.components(b, kv, b * n, verify=n > 1) for f in (shared, roof))
        assert got["attention"] == pytest.approx(want["attention"] / share)
        assert got["gdn_core"] == want["gdn_core"] and got["matmul.mlp"] == want["matmul.mlp"]
        # the measured share holds the attention's merge kernel: no longer priced as a launch
        assert got["launch"] == pytest.approx(want["launch"] - spec.n_attention_layers * bare.kernel_floor_s)
    mid = shared.components(1, 4096, 1, verify=False)["attention"] / roof.components(1, 4096, 1, False)["attention"]
    assert mid == pytest.approx(1 / 0.5625)  # halfway between 1024 and 16384 keys in log
    drafted, bare_draft = (f.draft_components(1, 16384, 1) for f in (shared, roof))  # the drafter's own cache read
    assert drafted["attention"] == pytest.approx(bare_draft["attention"] / 0.625)
    assert drafted["matmul"] == bare_draft["matmul"]


def test_attention_cells_are_keyed_by_rows_so_they_carry_across_groups():
    """The kernel tiles query rows, tokens x the GQA group: 27B (group 6) at 4 tokens takes
    the share of 24 rows, as 9B (group 4) does at 6 tokens, from the same cells."""
    import dataclasses

    from bole_cli.calibrate.costmodel import EFFICIENCY

    cells = tuple((keys, rows, share) for keys in (1024.0, 65536.0)
                  for rows, share in ((4.0, 1.0), (16.0, 0.8), (32.0, 0.4), (128.0, 0.2)))
    eff = dataclasses.replace(EFFICIENCY["h200"], attention_cells=cells)
    nine, twenty_seven = (RooflineForward(resolve_model(m), resolve_gpu("h200"), eff) for m in ("9b", "27b"))
    assert twenty_seven._attention_share(16, 4096, 4) == pytest.approx(nine._attention_share(16, 4096, 6))
    assert nine._attention_share(16, 4096, 8) == pytest.approx(0.4)  # 32 rows
    assert twenty_seven._attention_share(16, 4096, 8) < 0.4  # 48 rows, between 32 and 128


def test_the_drafter_attention_takes_its_own_rows_where_measured():
    """Drafter-form rows (unmasked, bench/drafter.py's call) give the drafter's cells, priced
    as draft_components prices them; the target's cells ignore them; a record without them
    leaves the drafter on the target's cells."""
    import dataclasses

    from bole_cli.calibrate.components import attention_cells
    from bole_cli.calibrate.costmodel import EFFICIENCY

    spec, gpu = resolve_model("9b"), resolve_gpu("h200")
    bare = dataclasses.replace(EFFICIENCY["h200"], attention_cells=(), draft_attention_cells=())
    roof = RooflineForward(spec, gpu, bare)
    target = [{"batch": b, "kv": kv, "tokens": n, "form": "decode" if n == 1 else "tree",
               "us": 2e6 * roof.components(b, kv, b * n, verify=n > 1)["attention"] / spec.n_attention_layers}
              for b in (1, 4) for kv in (1024, 4096) for n in (1, 4)]
    draft = [{"batch": b, "kv": kv, "tokens": 4, "form": "drafter",
              "us": 4e6 * roof.draft_components(b, kv, 4)["attention"]} for b in (1, 4) for kv in (1024, 4096)]
    record = {"model": spec.name, "attention": target + draft}
    cells, drafted = attention_cells(record), attention_cells(record, drafter=True)
    assert {c[2] for c in cells} == {0.5} and {c[2] for c in drafted if c[1] == 16.0} == {0.25}  # 4 tokens x 4
    assert attention_cells({"model": spec.name, "attention": target}, drafter=True) == ()
    both = RooflineForward(spec, gpu, dataclasses.replace(bare, attention_cells=cells, draft_attention_cells=drafted))
    alone = RooflineForward(spec, gpu, dataclasses.replace(bare, attention_cells=cells))
    want = roof.draft_components(4, 4096, 4)["attention"]
    assert both.draft_components(4, 4096, 4)["attention"] == pytest.approx(want / 0.25)
    assert alone.draft_components(4, 4096, 4)["attention"] == pytest.approx(want / 0.5)
    assert both.components(4, 4096, 16, verify=True)["attention"] == alone.components(4, 4096, 16, True)["attention"]


def test_gemm_knee_prices_a_gemm_above_its_roofline_near_the_ridge():
    """With a knee, a GEMM at the ridge (x = 1) costs its roofline times the knee there; with
    none (other GPUs' estimates before the knee is measured), the roofline alone."""
    import dataclasses

    from bole_cli.calibrate.costmodel import EFFICIENCY

    gpu = resolve_gpu("h200")
    knee = dataclasses.replace(EFFICIENCY["h200"], gemm_knee=((0.1, 1.0), (1.0, 1.5), (10.0, 1.0)))
    bare = dataclasses.replace(knee, gemm_knee=())
    with_knee, without = (RooflineForward(resolve_model("9b"), gpu, e) for e in (knee, bare))
    w = 4096 * 4096 * 2.0
    rows = gpu.bf16_flops * knee.flops / (gpu.mem_bandwidth * knee.bw)  # x = 1
    flops = 2.0 * rows * 4096 * 4096
    assert with_knee._gemm_time(w, flops, 0.0) == pytest.approx(1.5 * without._gemm_time(w, flops, 0.0))
    assert with_knee._gemm_time(w, 2.0 * 4096 * 4096, 0.0) == pytest.approx(without._gemm_time(w, 2.0 * 4096 * 4096, 0.0))


# ---- the H200 estimate against the shipped measured profiles ------------------------------------
AGREEMENT_MODELS = ("Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B")
T_DEC_TOLERANCE, TOK_S_TOLERANCE = 0.10, 0.15
# Cells where the estimate misses today, each with its measured reason (experiments/NOTES.md
# "The H200 profiles, knee and GPU suite on the step as of S23"); strict: a cell that starts
# agreeing fails here until it is taken off the list.
_NEAR_TIE = ("batch 4: the measurement's chain beats its runner-up tree by under 1% (4B kv 16384: "
             "0.2%; 27B kv 4096: 0.6%, kv 16384: 0.3%); the estimate decides the tree, its tokens/s "
             "1-8% above the measured chain's (the mode of a near tie flips between runs: "
             "experiments/NOTES.md \"The H200 profiles re-measured\")")
KNOWN_GAPS = {key: _NEAR_TIE for key in (("Qwen3.5-4B", 4, 16384), ("Qwen3.5-27B", 4, 4096),
                                         ("Qwen3.5-27B", 4, 16384))}


def _shipped_h200_cells():
    from bole_cli.profiles import profile_path, shipped_profiles_dir

    for model in AGREEMENT_MODELS:
        for c in load_profile(profile_path(shipped_profiles_dir(), "h200", model))["configs"]:
            key = (model, c["batch"], c["kv_len"])
            marks = [pytest.mark.xfail(reason=KNOWN_GAPS[key], strict=True)] if key in KNOWN_GAPS else []
            yield pytest.param(*key, marks=marks, id=f"{model}-b{key[1]}-kv{key[2]}")


@pytest.mark.parametrize("model, batch, kv", list(_shipped_h200_cells()))
def test_h200_estimate_agrees_with_the_shipped_measured_profile(model, batch, kv):
    """`bole calibrate --estimate --gpu h200` against the measured profile it stands in for,
    cell by cell: T_dec within 10%, the decided tokens/s within 15%, the same mode."""
    from bole_cli.profiles import profile_path, shipped_profiles_dir

    measured = next(c for c in load_profile(profile_path(shipped_profiles_dir(), "h200", model))["configs"]
                    if (c["batch"], c["kv_len"]) == (batch, kv))
    est = _estimated_entry("h200", model, batch, kv)
    assert est["t_dec"] / measured["t_dec"] - 1 == pytest.approx(0, abs=T_DEC_TOLERANCE)
    got, want = est["decision"]["chosen"], measured["decision"]["chosen"]
    assert got["tok_s"] / want["tok_s"] - 1 == pytest.approx(0, abs=TOK_S_TOLERANCE)
    assert got["mode"] == want["mode"]


def test_known_gaps_name_shipped_cells():
    cells = {tuple(p.values) for p in _shipped_h200_cells()}
    assert set(KNOWN_GAPS) <= cells
