"""SGLang 0.5.23 compatibility: source discovery, standalone kernel loading, hook targets.

Tests that need SGLang's source skip (with the reason) when neither an installed sglang
nor a wheel is available: the wheel lives in the git-ignored .whl/ folder or wherever
$BOLE_SGLANG_WHEEL points. Set BOLE_TEST_DOWNLOAD_SGLANG=1 to let the tests fetch the
wheel with pip into a temporary folder (bounded to 60 s) instead of skipping.

The kernel tests run SGLang's own Triton kernels on CPU under TRITON_INTERPRET=1, in a
subprocess (the interpreter must be chosen before the kernels are decorated), and compare
them with Bole's float64 references (bole_cli/kernels/reference.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bole_cli.errors import BoleError, InputError
from bole_cli.sglang import isolation as sglang_isolation
from bole_cli.sglang import baseline_kernels as sglang_kernels
from bole_cli.sglang import source as sglang_src
from bole_cli.sglang.targets import SGLANG_TARGETS, check_hook_targets
from bole_cli.sglang.source import SGLANG_VERSION, find_sglang_source
from bole_cli.trees import retrieve_parent_token

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- fixtures


def _download_wheel(dest: Path) -> Path | None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp",
        "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux_2_17_x86_64", "-d", str(dest), f"sglang=={SGLANG_VERSION}",
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    except (subprocess.SubprocessError, OSError):
        return None
    wheels = sorted(dest.glob("sglang-*.whl"))
    return wheels[0] if wheels else None


@pytest.fixture(scope="session")
def sglang_source(tmp_path_factory):
    try:
        return find_sglang_source()
    except BoleError as exc:
        reason = str(exc)
    if os.environ.get("BOLE_TEST_DOWNLOAD_SGLANG") == "1":
        wheel = _download_wheel(tmp_path_factory.mktemp("sglang-wheel"))
        if wheel is not None:
            return find_sglang_source(wheel)
        reason += " (and the opt-in download failed)"
    pytest.skip(f"needs SGLang {SGLANG_VERSION} source: {reason}")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bole-cache")


def _run_interpreted(script: str, source, cache_dir: Path, timeout: int = 300) -> dict:
    """Run `script` under TRITON_INTERPRET=1 in a fresh interpreter; it prints one JSON line."""
    env = dict(os.environ)
    env.update(
        TRITON_INTERPRET="1",
        BOLE_SGLANG_WHEEL=str(source.path),
        BOLE_CACHE_DIR=str(cache_dir),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------- without SGLang


@pytest.fixture
def no_sglang(monkeypatch, tmp_path):
    """Hide any installed sglang and the repository's .whl/ folder."""
    monkeypatch.setattr(sglang_src, "_installed_source", lambda: None)
    monkeypatch.setattr(sglang_src, "_repo_wheel_dir", lambda: tmp_path / "no-whl")
    monkeypatch.delenv(sglang_src.ENV_WHEEL, raising=False)


def test_not_found_is_one_clear_line(no_sglang):
    with pytest.raises(BoleError) as info:
        find_sglang_source()
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f'SGLang {SGLANG_VERSION} not found: pip install "sglang=={SGLANG_VERSION}"')
    assert sglang_src.ENV_WHEEL in msg
    assert not isinstance(info.value, InputError)
    with pytest.raises(BoleError, match="not found"):
        sglang_kernels.load_sglang_kernels()


def test_bad_env_path_is_input_error(no_sglang, monkeypatch, tmp_path):
    monkeypatch.setenv(sglang_src.ENV_WHEEL, str(tmp_path / "missing.whl"))
    with pytest.raises(InputError, match=sglang_src.ENV_WHEEL):
        find_sglang_source()
    bogus = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    bogus.write_text("not a zip")
    with pytest.raises(InputError, match="not a valid wheel"):
        find_sglang_source(bogus)


def _fake_tree(root: Path, version: str, gdn_triton_src: str) -> Path:
    pkg = root / "sglang"
    (pkg / "srt" / "layers" / "attention" / "linear" / "kernels").mkdir(parents=True)
    (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    (pkg / "srt" / "layers" / "attention" / "linear" / "kernels" / "gdn_triton.py").write_text(
        gdn_triton_src
    )
    return root


def test_directory_source_version_and_hook_drift(tmp_path):
    src_text = textwrap.dedent(
        """
        class TritonGDNKernel:
            def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states,
                              cache_indices, query_start_loc, intermediate_states_buffer,
                              intermediate_state_indices, retrieve_parent_token, **kwargs):
                pass
        """
    )
    root = _fake_tree(tmp_path / "site", "0.5.99", src_text)
    with pytest.raises(InputError, match="not SGLang 0.5.23"):
        find_sglang_source(root)
    src = find_sglang_source(root / "sglang", version=None)  # the package dir itself works too
    assert (src.kind, src.version, src.path) == ("directory", "0.5.99", root.resolve())
    problems = check_hook_targets(src)
    assert len(problems) == len(SGLANG_TARGETS)
    verify = next(t.target for t in SGLANG_TARGETS if t.target.endswith("TritonGDNKernel.target_verify"))
    tv = [p for p in problems if p.startswith(verify + ":")]
    assert len(tv) == 1 and "cache_steps" in tv[0] and "gdn_triton.py:3" in tv[0]
    assert all("\n" not in p for p in problems)


def test_parent_conversions():
    torch = pytest.importorskip("torch")
    # SGLang's docstring example (causal_conv1d_triton.py:591-604) and a second request.
    nxt = torch.tensor([[1, 3, -1, -1], [1, 2, 3, -1]])
    sib = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1]])
    parents = sum((retrieve_parent_token(n, s) for n, s in zip(nxt, sib)), [])
    assert parents == [-1, 0, 0, 1, -1, 0, 1, 2]
    # SGLang's own parent table against these parents: the tree-conv test below, on its kernel.



def test_kernel_table_names_every_kernel_field():
    import dataclasses

    listed = [n for names in sglang_kernels.KERNEL_FUNCTIONS.values() for n in names]
    not_kernels = {"version", "source", "isolated", "TritonGDNKernel", "layernorm_fn", "modules"}  # optional loads
    fields = [f.name for f in dataclasses.fields(sglang_kernels.SGLangKernels)
              if f.name not in not_kernels]
    assert sorted(listed) == sorted(fields) and len(set(listed)) == len(listed)
    assert sglang_kernels.KERNEL_MODULES[0] == sglang_kernels.VERIFY_MODULE


def test_the_gated_norm_loads_on_request_and_matches_float64(sglang_source, monkeypatch):
    """with_norm: SGLang's gated RMSNorm (its serving-stack helpers stubbed, its SM count
    answered under the interpreter) gives rms(x) * w * silu(z) a row, against float64; without
    it the field is empty."""
    import torch

    from bole_cli.sglang.baseline_kernels import load_sglang_kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    norm = load_sglang_kernels(with_norm=True).layernorm_fn
    assert load_sglang_kernels().layernorm_fn is None
    g = torch.Generator().manual_seed(0)
    x, z = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g)
    w = torch.rand(32, generator=g) + 0.5
    got = norm(x, w, None, z=z, eps=1e-6, group_size=None, norm_before_gate=True, is_rms_norm=True,
               activation="swish")
    x, z, w = x.double(), z.double(), w.double()
    want = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w * z * torch.sigmoid(z)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_isolated_sglang_imports_one_module_and_restores_sys_modules(tmp_path):
    pytest.importorskip("torch")
    folder = tmp_path / "sglang" / "kernels" / "ops" / "toy"
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text(
        "from sglang.srt.utils import is_cuda, is_cpu\n"
        "from sglang.kernels.jit.utils import is_arch_support_pdl\n"
        "ANSWERS = (is_cuda(), is_cpu(), is_arch_support_pdl())\n"
    )
    before = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    with sglang_isolation.isolated_sglang(tmp_path, ("sglang.kernels.ops.toy.probe",)):
        import importlib

        assert sys.modules["sglang"].__bole_stub__ is True
        assert sglang_isolation.live_sglang() is None  # a stub is not a live SGLang
        probe = importlib.import_module("sglang.kernels.ops.toy.probe")
        assert probe.__file__ == str(folder / "probe.py")
        assert all(isinstance(x, bool) for x in probe.ANSWERS) and probe.ANSWERS[1] is False
        with pytest.raises(AttributeError, match="does not provide sglang.srt.utils.nothing"):
            sys.modules["sglang.srt.utils"].nothing  # noqa: B018
    after = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    assert after == before


def test_interpreter_fix_only_under_the_interpreter(monkeypatch):
    from bole_cli.sglang.triton_interpreter import fix_triton_interpreter_masks

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert fix_triton_interpreter_masks() is False


# ----------------------------------------------------------------- with SGLang's source


def test_hook_targets_match_sglang_source(sglang_source):
    assert sglang_source.version == SGLANG_VERSION
    assert check_hook_targets(sglang_source) == []


def test_loader_imports_kernels_without_sglang_init(sglang_source, cache_dir):
    out = _run_interpreted(
        """
        import json, sys
        from bole_cli.sglang.baseline_kernels import load_sglang_kernels, KERNEL_MODULES
        k = load_sglang_kernels()
        again = load_sglang_kernels()
        print(json.dumps({
            "version": k.version,
            "isolated": k.isolated,
            "cached": again is k,
            "modules": sorted(k.modules),
            "leftover": sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang.")),
            "kernel_type": type(k.modules[KERNEL_MODULES[0]]
                                .fused_sigmoid_gating_delta_rule_update_kernel).__name__,
            "verify_module": k.fused_sigmoid_gating_delta_rule_update.__module__,
            "file": k.modules[KERNEL_MODULES[0]].__file__,
        }))
        """,
        sglang_source, cache_dir,
    )
    assert out["version"] == SGLANG_VERSION
    assert out["isolated"] is True and out["cached"] is True
    assert out["modules"] == sorted(sglang_kernels.KERNEL_MODULES)
    assert out["leftover"] == []  # no stub sglang left behind; sglang/__init__ never ran
    assert out["kernel_type"] == "InterpretedFunction"
    assert out["verify_module"] == sglang_kernels.VERIFY_MODULE
    assert out["file"].endswith("fused_sigmoid_gating_recurrent.py")


_TREE_SCRIPT = """
import json
import torch
from bole_cli.sglang.baseline_kernels import load_sglang_kernels
from bole_cli.trees import retrieve_parent_token
from bole_cli.kernels import reference as ref

torch.manual_seed(0)
k = load_sglang_kernels()
trees = [[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3], [-1, 0, 0, 0, 3]]  # one root (node 0) each
bs, T = len(trees), len(trees[0])
H, HV, K, V, W, S = 2, 4, 16, 16, 4, 6
N, dim = bs * T, 2 * H * K + HV * V
slots = torch.tensor([4, 1, 2], dtype=torch.int32)
rows = torch.arange(bs, dtype=torch.int32)          # scratch row = batch position
cu = torch.arange(0, N + 1, T, dtype=torch.int32)   # query_start_loc


def links(par):
    from bole_cli.trees import ProposalTree, to_sglang

    arrays = to_sglang(ProposalTree(par, [0.0] * len(par)))
    return list(arrays.retrive_next_token), list(arrays.retrive_next_sibling)


nt = torch.tensor([links(p)[0] for p in trees])
ns = torch.tensor([links(p)[1] for p in trees])
res = {}

# 1. tree conv (fp32: the interpreter mis-computes bf16*bf16) + parent fill-in
mixed = torch.randn(N, dim)
conv_state = torch.randn(S, dim, W - 1)
conv0 = conv_state.clone()
weight = torch.randn(dim, W) * 0.5
icw = torch.zeros(bs + 1, T, dim, W - 1)
rpt = torch.empty_like(nt)
y = k.causal_conv1d_update(
    mixed.view(bs, T, -1).transpose(1, 2), conv_state, weight, None, "silu",
    conv_state_indices=slots, intermediate_conv_window=icw, intermediate_state_indices=rows,
    retrieve_next_token=nt, retrieve_next_sibling=ns, retrieve_parent_token=rpt,
).transpose(1, 2).reshape(N, -1)
parents = torch.tensor(sum((retrieve_parent_token(a, b) for a, b in zip(nt, ns)), []),
                       dtype=torch.int32)
res["rpt"] = rpt.tolist()
table_parents = sum(([-1] + row[1:] for row in rpt.tolist()), [])  # SGLang: 0 at node 0
res["parents_ok"] = table_parents == sum(trees, []) == parents.tolist()
res["conv_err"] = (y.double() - ref.tree_conv_ref(mixed, conv0, weight, None, slots, parents, cu)).abs().max().item()
res["conv_state_is_last_inputs"] = all(
    torch.equal(conv_state[s], mixed[b * T + T - (W - 1): (b + 1) * T].T) for b, s in enumerate(slots.tolist())
)
acc = torch.tensor([3, 4, 2])
new_conv = conv_state.clone()
k.copy_back_accepted(new_conv.unsqueeze(0), icw.unsqueeze(0), slots, acc)
res["conv_commit_err"] = (new_conv - ref.tree_conv_commit_ref(conv0, mixed, slots, parents, cu, acc)).abs().max().item()

# 2. serial tree verify, exactly as TritonGDNKernel.target_verify calls it
for name, act in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    q, kk, v = torch.split(y.to(act), [H * K, H * K, HV * V], dim=-1)  # strided views, as SGLang
    q, kk, v = q.view(1, N, H, K), kk.view(1, N, H, K), v.view(1, N, HV, V)
    a, b = torch.randn(N, HV).to(act), torch.randn(N, HV).to(act)
    A_log, dt_bias = torch.randn(HV) * 0.5, torch.randn(HV).to(act)
    ssm = torch.randn(S, HV, V, K) * 0.3
    ssm0 = ssm.clone()
    inter = torch.zeros(bs + 1, T, HV, V, K)
    o = k.target_verify(
        A_log, dt_bias, q, kk, v, a, b, ssm_states=ssm, cache_indices=slots, query_start_loc=cu,
        intermediate_states_buffer=inter, intermediate_state_indices=rows, cache_steps=T,
        retrieve_parent_token=rpt,
    )
    g, beta = ref.gdn_gates_ref(A_log, a, dt_bias, b)
    o_seq, snaps = ref.tree_verify_sequential_ref(q[0], kk[0], v[0], g, beta, ssm0, slots, parents, cu)
    cf = ref.tree_verify_ref(q[0], kk[0], v[0], g, beta, ssm0, slots, parents, cu)
    new_ssm = ssm.clone()
    k.copy_back_accepted(new_ssm.unsqueeze(0), inter.unsqueeze(0), slots, acc)
    commit = ref.tree_commit_ref(ssm0.double(), slots, kk[0], cf.u, cf.log_p, parents, cu, acc)
    res[name] = {
        "o_shape": list(o.shape), "o_dtype": str(o.dtype),
        "state_untouched": torch.equal(ssm, ssm0),
        "o_err": (o[0].double() - o_seq).abs().max().item(),
        "o_err_closed_form": (o[0].double() - cf.o).abs().max().item(),
        "o_scale": o_seq.abs().max().item(),
        "snap_err": (inter[:bs].reshape(N, HV, V, K).double() - snaps).abs().max().item(),
        "commit_err": (new_ssm.double() - commit).abs().max().item(),
    }

# 3. gate preparation kernel
gg, bb = k.fused_gdn_gating(A_log, a.float(), b.float(), dt_bias.float())
g, beta = ref.gdn_gates_ref(A_log, a.float(), dt_bias.float(), b.float())
res["gating"] = [list(gg.shape), (gg[0].double() - g).abs().max().item(), (bb[0].double() - beta).abs().max().item()]
print(json.dumps(res))
"""


def test_sglang_tree_kernels_run_on_cpu_and_match_reference(sglang_source, cache_dir):
    res = _run_interpreted(_TREE_SCRIPT, sglang_source, cache_dir)
    # retrieve_parent_token is FILLED by the conv kernel; node 0's entry is 0 ("n/a").
    assert res["rpt"] == [[0, 0, 0, 1, 2], [0, 0, 1, 2, 3], [0, 0, 0, 0, 3]]
    assert res["parents_ok"]
    assert res["conv_err"] < 1e-5
    assert res["conv_state_is_last_inputs"]  # verify overwrites the committed conv state
    assert res["conv_commit_err"] == 0.0
    for name, tol in (("fp32", 1e-5), ("bf16", 2e-2)):
        r = res[name]
        assert r["o_shape"] == [1, 15, 4, 16]
        assert r["o_dtype"] == ("torch.float32" if name == "fp32" else "torch.bfloat16")
        assert r["state_untouched"]  # disable_state_update=True
        assert r["o_err"] < tol * max(1.0, r["o_scale"]), r
        assert r["o_err_closed_form"] < tol * max(1.0, r["o_scale"]), r
        assert r["snap_err"] < 1e-5, r  # snapshots: [rows, D, HV, V, K] fp32, exact
        assert r["commit_err"] < 1e-5, r
    shape, g_err, b_err = res["gating"]
    assert shape == [1, 15, 4] and g_err < 1e-5 and b_err < 1e-5


_REPLAYSSM_SCRIPT = """
import json
import torch
from bole_cli.sglang.baseline_kernels import load_sglang_kernels
from bole_cli.kernels import reference as ref

torch.manual_seed(1)
k = load_sglang_kernels()
H, HV, K, V, S = 2, 4, 16, 16, 6
res = {}
for T in (2, 5):
    bs = 3
    N = bs * T
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    cu = torch.arange(0, N + 1, T, dtype=torch.int32)
    parents = torch.tensor([-1] + list(range(T - 1)), dtype=torch.int32).repeat(bs)
    accept_lens = torch.tensor([1, T, max(1, T - 1)], dtype=torch.int32)  # incl. the bonus
    for act_name, act in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for state_name, sdt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            q, kk = torch.randn(N, H, K).to(act), torch.randn(N, H, K).to(act)
            v = torch.randn(N, HV, V).to(act)
            a, b = torch.randn(N, HV).to(act), torch.randn(N, HV).to(act)
            A_log, dt_bias = torch.randn(HV) * 0.5, torch.randn(HV)
            pool = (torch.randn(1, S, HV, V, K) * 0.3).to(sdt)
            pool0 = pool.clone()
            rings = k.replayssm_rings(pool, T, H, act)
            o = k.replayssm_verify(A_log, dt_bias, q[None], kk[None], v[None], a, b,
                                   ssm_states=pool[0], cache_indices=slots, query_start_loc=cu,
                                   rings={name: r[0] for name, r in rings.items()})
            untouched = torch.equal(pool, pool0)
            k.replayssm_fold(pool, rings, slots, accept_lens)
            g, beta = ref.gdn_gates_ref(A_log, a, dt_bias, b)
            o_ref, snaps = ref.tree_verify_sequential_ref(q, kk, v, g, beta, pool0[0], slots, parents, cu)
            want = pool0[0].double().clone()
            for r, s in enumerate(slots.tolist()):
                want[s] = snaps[r * T + int(accept_lens[r]) - 1]
            ring_k = rings["replayssm_rawk"][0][slots.long()]  # [bs, H, T, K]
            res[f"T{T}-{act_name}-{state_name}"] = {
                "o_shape": list(o.shape), "untouched": untouched,
                "o_err": (o.reshape(N, HV, V).double() - o_ref).abs().max().item(),
                "o_scale": o_ref.abs().max().item(),
                "state_err": (pool[0].double() - want).abs().max().item(),
                "state_scale": want.abs().max().item(),
                "other_slots_kept": torch.equal(pool[0][[0, 3, 5]], pool0[0][[0, 3, 5]]),
                "ring_k_is_raw_k": torch.equal(ring_k.transpose(1, 2).reshape(N, H, K), kk),
                "ring_g_err": (rings["replayssm_g"][0][slots.long()].transpose(1, 2).reshape(N, HV).double()
                               - g).abs().max().item(),
            }
print(json.dumps(res))
"""


def test_replayssm_chain_verify_and_fold_match_reference(sglang_source, cache_dir):
    """ReplaySSM called as SGLang calls it: the ring-writing verify leaves the state alone
    and matches the float64 recurrence; the fold of each accepted prefix gives the state
    after that prefix. A mis-called baseline (wrong ring layout, accept length off by one,
    wrong slot) fails here, not in a GPU benchmark."""
    res = _run_interpreted(_REPLAYSSM_SCRIPT, sglang_source, cache_dir)
    assert len(res) == 8
    for name, r in res.items():
        act_tol = 1e-5 if "-fp32-" in name else 2e-2
        state_tol = 1e-5 if name.endswith("fp32") and "-fp32-" in name else 2e-2
        assert r["untouched"] and r["other_slots_kept"] and r["ring_k_is_raw_k"], (name, r)
        assert r["o_shape"][-2:] == [4, 16]
        assert r["o_err"] < act_tol * max(1.0, r["o_scale"]), (name, r)
        assert r["state_err"] < state_tol * max(1.0, r["state_scale"]), (name, r)
        assert r["ring_g_err"] < 1e-5, (name, r)


@pytest.mark.parametrize("interpreting", [True, False])
def test_sglangs_no_triton_warning_is_quiet_only_under_the_interpreter(tmp_path, monkeypatch, interpreting):
    """fla's utils warn "Triton is not supported on current platform" when SGLang's kernels
    load under the interpreter (CPU runs): expected there, so not printed; on a GPU the same
    warning would be news, so it is left alone."""
    import importlib
    import warnings

    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "warns.py").write_text(
        "import warnings\nwarnings.warn('Triton is not supported on current platform, roll back to CPU.')\n")
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpreting else "0")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with sglang_isolation.isolated_sglang(tmp_path, ("sglang.warns",)):
            importlib.import_module("sglang.warns")
    assert [str(w.message) for w in seen] == ([] if interpreting else
                                              ["Triton is not supported on current platform, roll back to CPU."])
