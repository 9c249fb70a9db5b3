"""bole_cli.calibrate.observed: the acceptance model fitted to observed accepted-length
histograms (docs/design.md §8, "Observed histograms").

Statistical tests draw their histograms from seeded generators and run derandomised, so
they are reproducible; their tolerances are set wide of the sampling noise (stated at each).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.budget import select_budget
from bole_cli.calibrate import acceptance as acc
from bole_cli.calibrate import family_fit, histogram_file
from bole_cli.calibrate import observed as obs_mod
from bole_cli.calibrate.observed import (family_rows, goodness, kept_depth_mass, rank_rows,
                                         stop_probs)
from bole_cli.errors import InputError
from bole_cli.stats import wilson, z_for_level
from bole_cli.trees.generators import beam_tree, beam_tree_size

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


def sample(probs, steps, seed):
    """A multinomial draw of `steps` verify steps over accepted lengths 0..D."""
    r = random.Random(seed)
    hits = Counter(r.choices(range(len(probs)), weights=probs, k=steps))
    return [hits.get(L, 0) for L in range(len(probs))]


def doc(counts, d, k, n=None, **extra):
    spec = {"num_steps": d, "topk": k}
    if n is not None:
        spec["num_draft_tokens"] = n
    return {"accepted_length_histogram": {"counts": list(counts)}, "speculative": spec, **extra}


def tree_probs(a, d, k, n, decay=acc.DEPTH_DECAY, rf=acc.DEFAULT_RANK_FACTOR):
    return stop_probs(kept_depth_mass(family_rows(a, decay, rf, d, k), d, k, n))


# ---- one family for acceptance.py and this module (calibrate/ranks.py) ---------------------
def test_the_family_is_shared_not_copied():
    assert family_fit.DEPTH_DECAY == acc.DEPTH_DECAY
    assert family_fit.DEFAULT_RANK_FACTOR == acc.DEFAULT_RANK_FACTOR
    assert histogram_file.PAPER_DEPTH == acc.PAPER_DEPTH
    assert obs_mod.rank_rows is acc.rank_matrix
    assert histogram_file.beam_tree_size is beam_tree_size


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.integers(1, 6),
       st.floats(0.0, 1.0))
def test_rank_rows_is_acceptance_rank_matrix(per_depth, k, rf):
    assert rank_rows(per_depth, k, rf) == acc.rank_matrix(per_depth, k, rf)


def test_family_rows_at_the_preset_values_are_preset_rows():
    got = family_rows(0.8, acc.DEPTH_DECAY, acc.DEFAULT_RANK_FACTOR, 8, 4)
    want = acc.preset_rows(0.8)
    assert [x for r in got for x in r] == pytest.approx([x for r in want for x in r], rel=1e-12)


@settings(max_examples=60)
@given(st.integers(1, 7), st.integers(2, 6), st.floats(0.05, 0.99), st.floats(0.6, 1.08),
       st.floats(0.02, 1.0), st.data())
def test_kept_depth_mass_is_the_pruned_beam_tree(d, k, a, decay, rf, data):
    """The tree of the likelihood is beam_tree + select_budget, node for node in mass."""
    if beam_tree_size(d, k) > 256:
        d = 1 + (256 - 1 - k) // (k * k)
    n = data.draw(st.integers(2, beam_tree_size(d, k)))
    q = family_rows(a, decay, rf, d, k)
    tree = beam_tree(d, k, level_probs=q)
    sel = select_budget([tree], n)
    depths = tree.depths
    want = [0.0] * (d + 1)
    for i in sel.kept_ids[0]:
        want[depths[i] - 1] += math.exp(tree.log_rho[i])
    got = kept_depth_mass(q, d, k, n)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)
    probs = stop_probs(got)
    assert math.fsum(probs) == pytest.approx(1.0, abs=1e-12) and min(probs) >= 0
    # mean accepted drafts = sum of P over the kept drafts (acceptance.py's E1 - 1)
    mean = math.fsum(L * p for L, p in enumerate(probs))
    assert mean == pytest.approx(sel.expected_accepted[0] - 1.0, rel=1e-9, abs=1e-12)


def test_trees_beyond_the_node_limit_are_modelled():
    """SGLang's own example (5 steps, top-k 8, 64 tokens) has 265 candidates."""
    assert beam_tree_size(5, 8) > 256
    probs = tree_probs(0.8, 5, 8, 64)
    assert len(probs) == 6 and math.fsum(probs) == pytest.approx(1.0)


def test_the_verdict_needs_a_significant_and_visible_misfit():
    probs = [0.2, 0.3, 0.5]
    huge = [2_020_000, 2_980_000, 5_000_000]  # 0.002 off: 16 sd over 1e7 steps
    g = goodness(huge, probs, 1)
    assert g["p_value"] < 1e-3 and g["max_abs_diff"] < 0.01
    assert g["quality"] == "good fit" and "significant" in g["verdict"]
    bad = goodness([300, 200, 500], probs, 1)
    assert bad["quality"] == "poor fit" and bad["verdict"].startswith("poor fit: the model")
    assert bad["max_abs_diff"] == pytest.approx(0.1) and bad["max_abs_diff_at"] in (0, 1)
    assert goodness([200, 300, 500], probs, 1)["verdict"].startswith("good fit")
    assert goodness([200, 300, 500], probs, 2)["quality"] == "untested"


# ---- chains: exact per depth ---------------------------------------------------------------
def test_chain_acceptance_is_the_survival_ratio():
    counts = [40, 30, 20, 10]  # S = 100, 60, 30, 10
    m = acc.from_data(doc(counts, 3, 1), "c.yaml")
    assert [row[0] for row in m.q[:3]] == pytest.approx([0.6, 0.5, 1 / 3], abs=1e-6)
    assert len(m.q) == 8 and all(len(row) == 1 for row in m.q)  # depths 4-8 extrapolated
    pd = m.measured["per_depth"]
    assert pd["trials"] == [100, 60, 30] and pd["hits"] == [60, 30, 10]
    assert m.measured["extrapolated_depths"] == [4, 5, 6, 7, 8]
    assert "depths 4-8 extrapolated" in m.source and "exact per depth" in m.source
    assert m.chain(3) == pytest.approx(1 + 0.6 + 0.3 + 0.1, abs=1e-5)  # mean accept length
    assert m.measured["fit"]["df"] == 1  # 4 cells - 1 - (a, decay)


@settings(max_examples=25, derandomize=True)
@given(st.lists(st.floats(0.3, 0.97), min_size=1, max_size=8), st.integers(0, 2**31))
def test_chain_histogram_recovers_known_acceptance_within_its_intervals(a_d, seed):
    """At level 0.9999 a depth misses with probability 1e-4 (Wilson is close to nominal at
    these trial counts): 25 x 8 depths would miss once in ~50 runs, and the run is fixed."""
    d = len(a_d)
    counts = sample(stop_probs(obs_mod.chain_mass(a_d, d)), 20_000, seed)
    m = acc.from_data(doc(counts, d, 1, d + 1, interval_level=0.9999), "c.yaml")
    pd = m.measured["per_depth"]
    for depth, (true, lo, hi, t) in enumerate(zip(a_d, pd["lower"], pd["upper"], pd["trials"])):
        if t >= 30:
            assert lo <= true <= hi, (depth, true, lo, hi)
    assert all(m.q[i][0] == pytest.approx(h / t, abs=1e-6)
               for i, (h, t) in enumerate(zip(pd["hits"], pd["trials"])) if t)


def test_chain_intervals_cover_at_their_level():
    """300 histograms, 4 depths each, at level 0.9: 1200 intervals; coverage within
    +-0.03 of 0.9 (3.5 binomial standard deviations)."""
    a_d = [0.85, 0.8, 0.7, 0.75]
    probs = stop_probs(obs_mod.chain_mass(a_d, 4))
    covered = total = 0
    for seed in range(300):
        counts = sample(probs, 400, seed)
        survival = [sum(counts[d:]) for d in range(5)]
        for d in range(4):
            lo, hi = wilson(survival[d + 1], survival[d], z_for_level(0.9))
            covered += lo <= a_d[d] <= hi
            total += 1
    assert 0.87 <= covered / total <= 0.93


def test_chain_depths_never_reached_are_extrapolated():
    m = acc.from_data(doc([60, 0, 0], 2, 1), "c.yaml")
    assert m.q[0][0] == 0.0
    assert 2 in m.measured["extrapolated_depths"]


def test_a_bimodal_chain_is_exact_but_its_family_fits_poorly():
    counts = [5000, 100, 100, 100, 100, 5000]
    m = acc.from_data(doc(counts, 5, 1), "c.yaml")
    verdict = m.measured["verdict"]
    assert verdict.startswith("exact at the observed depths") and "poor fit" in verdict


# ---- trees: the preset family by maximum likelihood ----------------------------------------------
TREE_CASES = [(8, 4, 32), (5, 4, 16), (6, 8, 64), (7, 2, 12), (5, 8, 64)]
PRESETS = sorted(acc.PRESET_TARGETS)


@pytest.mark.parametrize("case, name, seed", [
    (case, PRESETS[(i + j) % len(PRESETS)], 100 * i + j)
    for i, case in enumerate(TREE_CASES) for j in (0, 2)])
def test_tree_histogram_from_a_preset_is_recovered(case, name, seed):
    """20k steps pin a to about +-0.01 at these depths (+-0.05 at top-k 8, where the rank
    factor trades against a); the profile interval at level 0.999 holds the truth. Fixed
    draws (hypothesis' shrinking of a 1-second fit ran for minutes)."""
    d, k, n = case
    a = acc.preset(name).q[0][0]
    counts = sample(tree_probs(a, d, k, n), 20_000, seed)
    m = acc.from_data(doc(counts, d, k, n, name="sampled", interval_level=0.999), "t.yaml")
    fit = m.measured["fit"]
    assert abs(fit["family"]["a"] - a) <= 0.02, fit
    iv = fit["a_interval"]
    assert iv["lower"] <= a <= iv["upper"] and iv["lower"] <= fit["family"]["a"] <= iv["upper"]
    assert 0 < iv["upper"] - iv["lower"] < 0.15, iv
    assert fit["quality"] == "good fit", fit["verdict"]
    assert fit["verdict"].startswith("good fit")
    assert m.q[0][0] == pytest.approx(fit["family"]["a"], abs=1e-5)
    assert len(m.q) == max(d, 8) and all(len(row) == k for row in m.q)
    assert m.name == "sampled" and "observed: 20000" in m.source


def test_the_fit_reaches_the_likelihood_of_the_truth():
    """The likelihood jumps where the kept nodes change; the search must still end at
    least as high as the true parameters (a single golden section did not)."""
    d, k, n, a = 8, 4, 32, 0.932
    counts = sample(tree_probs(a, d, k, n), 20_000, 5)
    o = histogram_file.parse_observation(doc(counts, d, k, n), "t.yaml")
    probs_of = obs_mod._tree_probs(o)
    truth = family_fit.log_likelihood(counts, probs_of({"a": a, "decay": 0.97, "rank_factor": 0.5}))
    _, best = family_fit.fit_family(o, probs_of, family_fit.free_parameters(d, k))
    assert best >= truth - 1e-9


@pytest.mark.parametrize("counts", [
    [9000, 200, 200, 200, 200, 200, 9000],   # bimodal
    [0, 0, 0, 20000, 0, 0, 0],               # every step exactly 3 drafts
])
def test_a_histogram_of_another_shape_is_a_poor_fit(counts):
    m = acc.from_data(doc(counts, 6, 4, 32), "t.yaml")
    assert m.measured["fit"]["quality"] == "poor fit"
    assert m.measured["verdict"].startswith("poor fit: the model does not explain")
    assert "poor fit" in m.source


def test_shallow_histograms_fix_what_they_cannot_pin_down():
    counts = sample(tree_probs(0.8, 2, 4, 8), 5000, 3)
    fit = acc.from_data(doc(counts, 2, 4, 8), "t.yaml").measured["fit"]
    assert fit["fitted_parameters"] == ["a"] and set(fit["fixed_parameters"]) == {
        "decay", "rank_factor"}
    assert fit["df"] >= 0


def test_the_accept_length_convention_is_the_same_histogram_shifted():
    counts = sample(tree_probs(0.8, 5, 4, 16), 3000, 1)
    plain = acc.from_data(doc(counts, 5, 4, 16), "t.yaml")
    d = doc([0] + counts, 5, 4, 16)
    d["accepted_length_histogram"]["convention"] = "accept_length"
    sglang = acc.from_data(d, "t.yaml")
    assert sglang.q == plain.q and sglang.measured["convention"] == "accept_length"
    assert sglang.measured["counts"] == counts


def test_the_model_travels_like_a_measured_file():
    counts = sample(tree_probs(0.8, 5, 4, 16), 3000, 2)
    m = acc.from_data(doc(counts, 5, 4, 16, extrapolate_to=5), "t.yaml")
    d = m.describe()
    assert d["measured"]["fit"]["g"] >= 0 and d["measured"]["steps"] == 3000
    assert d["measured"]["extrapolated_depths"] == [] and len(m.q) == 5
    assert "extrapolated" not in m.source
    yaml.safe_dump(d)  # plain data only
    assert m.per_request(16) > 1


# ---- bad input: one InputError naming the field ----------------------------------------------
GOOD = doc([20, 20, 20, 20], 3, 4, 8)


def _bad(**changes):
    d = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        block, _, key = path.partition("__")
        if key:
            d[block][key] = value
        elif value is None:
            d.pop(block)
        else:
            d[block] = value
    return d


@pytest.mark.parametrize("data, field", [
    (_bad(accepted_length_histogram__counts=[20, -1, 20, 20]), "counts[1]"),
    (_bad(accepted_length_histogram__counts=[20, 20, 20]), "counts"),
    (_bad(accepted_length_histogram__counts=[20, 20, 20, 20, 20]), "counts"),
    (_bad(accepted_length_histogram__counts=[20, True, 20, 20]), "counts[1]"),
    (_bad(accepted_length_histogram__counts=[20, 2.5, 20, 20]), "counts[1]"),
    (_bad(accepted_length_histogram__counts=[10, 10, 10, 10]), "counts"),
    (_bad(accepted_length_histogram__counts="1,2,3"), "counts"),
    (_bad(accepted_length_histogram__convention="sglang"), "convention"),
    (_bad(accepted_length_histogram__conventon="accept_length"),
     "accepted_length_histogram: unknown field 'conventon' (did you mean 'convention'?)"),
    (_bad(speculative__num_step=3), "speculative: unknown field 'num_step' (did you mean 'num_steps'?)"),
    (_bad(speculative__topk=0), "speculative.topk"),
    (_bad(speculative__topk=True), "speculative.topk"),
    (_bad(speculative__num_steps=0), "speculative.num_steps"),
    (_bad(speculative__num_steps=10**400), "speculative.num_steps"),
    (_bad(speculative__num_draft_tokens=beam_tree_size(3, 4) + 1), "num_draft_tokens"),
    (_bad(speculative__num_draft_tokens=None), "num_draft_tokens"),
    (_bad(speculative=None), "speculative"),
    (_bad(accepted_length_histogram=[1, 2]), "accepted_length_histogram"),
    (_bad(extrapolate_to=2), "extrapolate_to"),
    (_bad(interval_level=1.0), "interval_level"),
    (doc([20, 20, 20, 20], 3, 1, 3), "num_draft_tokens"),           # chain: n = D + 1
    (doc([20, 20, 20, 20], 3, 4, 3), "counts[3]"),                  # 3 drafts in 2 slots
    ({**GOOD, "per_depth": [0.5]}, "exactly one of"),
])
def test_bad_input_is_one_error_naming_the_field(data, field):
    with pytest.raises(InputError) as info:
        acc.from_data(data, "obs.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("obs.yaml") and field in msg


def test_accept_length_needs_a_zero_first_cell():
    d = doc([1, 20, 20, 20, 20], 3, 4, 8)
    d["accepted_length_histogram"]["convention"] = "accept_length"
    with pytest.raises(InputError, match=r"counts\[0\]"):
        acc.from_data(d, "obs.yaml")


# ---- end to end through the CLI ------------------------------------------------------------------
@pytest.fixture
def no_gpu(monkeypatch):
    import bole_cli.catalog.hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)


def test_calibrate_reads_an_observed_histogram(no_gpu, tmp_path):
    counts = sample(tree_probs(0.85, 6, 4, 32), 5000, 7)
    path = tmp_path / "observed.yaml"
    path.write_text(yaml.safe_dump(doc(counts, 6, 4, 32, name="my traffic")))
    out = tmp_path / "p.yaml"
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1",
                                "--kv", "4096", "--acceptance", str(path), "--estimate",
                                "--out", str(out), "--no-plot", "--json"])
    assert r.exit_code == 0, r.stderr
    profile = json.loads(r.stdout)["profile"]
    got = profile["acceptance"]
    assert got["name"] == "my traffic" and "observed: 5000" in got["source"]
    assert got["measured"]["fit"]["quality"] == "good fit"
    assert abs(got["measured"]["fit"]["family"]["a"] - 0.85) < 0.05
    assert yaml.safe_load(out.read_text())["acceptance"]["measured"]["steps"] == 5000
    # the screen says how good the fit is, in one place after the table
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--batch", "1",
                                "--kv", "4096", "--acceptance", str(path), "--estimate",
                                "--out", str(out), "--no-plot"])
    assert r.exit_code == 0, r.stderr
    assert "acceptance: 5000 observed verify steps" in r.stdout and "good fit" in r.stdout


def test_calibrate_names_the_bad_field(no_gpu, tmp_path):
    path = tmp_path / "observed.yaml"
    path.write_text(yaml.safe_dump(doc([5, 5, 5, 5], 3, 4, 8)))
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--acceptance",
                                str(path), "--estimate", "--out", str(tmp_path / "p.yaml"),
                                "--no-plot"])
    assert r.exit_code == 2
    assert "accepted_length_histogram.counts" in r.stderr and "at least 50" in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_histogram_file_refuses_keys_it_would_ignore(tmp_path):
    from bole_cli.calibrate.acceptance import load_acceptance

    counts = sample(tree_probs(0.85, 6, 4, 32), 500, 3)
    for extra in ("top_k", "rank_factor"):
        path = tmp_path / f"{extra}.yaml"
        path.write_text(yaml.safe_dump(dict(doc(counts, 6, 4, 32), **{extra: 2 if extra == "top_k" else 0.5})))
        with pytest.raises(InputError, match=f"{extra}: not read"):
            load_acceptance(str(path))
