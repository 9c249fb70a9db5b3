"""Correctness gate: a candidate config runs on a small random case and is compared with
the float64 references before it may be timed. A wrong config is rejected, one that does
not compile (or needs more shared memory than the GPU has) is skipped; neither is fatal.

The case keeps the model's head counts and dims (so the compiled kernel is the one the
timing then reuses) but few nodes: four requests mixing tree shapes (chains deeper than
every node chunk, wide trees, several roots). tree_verify's one-tile configs are checked on
trees no larger than their bucket's (the same TP as the timed launches), its blocked
configs on a tree of the bucket's size when that is past one tile, else 130 nodes (several
chunks, ancestor words past the first; the same TP as the timed launches). Both run gated
(as the runtime calls them) and ungated (g and beta in float32, as the SGLang plug-in does),
the verify with its factors and as served without them. The replay commit is checked on
trees no larger than its bucket's, under the timed launches' promises (the bucket's size and
the benches' random-tree depth: the same compiled walk; a deeper path in the case costs
time, never exactness). The other kernels on 80, 17, 1 and 40 nodes. Tolerances: 2e-3 relative (float32 activations),
1e-2 (bfloat16/float16 activations, the reference computed from the same rounded inputs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from bole_cli.errors import BoleError, InputError
from bole_cli.limits import MAX_TILE_NODES, MAX_TREE_NODES

CHECK_SIZES = (80, 17, 1, 40)


def check_sizes(kernel: str, config: Mapping[str, int], nodes: Optional[int] = None) -> tuple[int, ...]:
    """Tree sizes of the correctness case for `kernel` with `config` (see the docstring);
    nodes: the bucket's tree size (one-tile tree_verify: the largest tree of the case)."""
    from bole_cli.kernels.verify_path import is_blocked_config  # here: bole_cli.kernels loads torch

    if kernel == "tree_commit_replay":
        n = min(int(nodes or MAX_TILE_NODES), MAX_TREE_NODES)
        return (n, max(1, n // 3), 1, max(1, n - 1))
    if kernel != "tree_verify":
        return CHECK_SIZES
    if is_blocked_config(config):  # the bucket's own size past one tile (the timed TP), else 130
        big = int(nodes) if nodes and int(nodes) > MAX_TILE_NODES else 130
        return (min(big, MAX_TREE_NODES), 17, 1, 40)
    n = min(int(nodes or MAX_TILE_NODES), MAX_TILE_NODES)
    return (n, max(1, n // 3), 1, max(1, n - 1))


@dataclass
class Verdict:
    ok: bool
    outcome: str  # "ok" | "rejected" (wrong result) | "skipped" (did not compile / run)
    reason: str = ""
    error: Optional[float] = None  # worst relative error seen

    def to_dict(self) -> dict:
        return {"ok": self.ok, "outcome": self.outcome, "reason": self.reason, "error": self.error}


def tolerance(act_dtype) -> float:
    import torch

    return 2e-3 if act_dtype == torch.float32 else 1e-2


def rel_err(got, want) -> float:
    """||got - want|| / ||want|| in float64 on the CPU; inf when got is not finite."""
    import torch

    a, b = got.detach().double().cpu(), want.detach().double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def verify_path_kwargs(config: Mapping[str, int], max_nodes: int) -> dict:
    """tree_verify arguments that send a launch down the kernel the config is for: a
    one-tile config (VSPLIT) gets the tree-size promise; a blocked one (BC) gets it only
    past one tile (it sizes the kernel's register walk, as `bole bench kernels` promises it),
    and is withheld otherwise (a promise <= 64 would pick the one-tile kernel)."""
    from bole_cli.kernels.verify_path import is_blocked_config

    if is_blocked_config(config) and int(max_nodes) <= MAX_TILE_NODES:
        return {"check_trees": False}
    return {"check_trees": False, "max_nodes": int(max_nodes)}


def commit_promise(nodes: int) -> dict:
    """The replay commit's promises for a bucket of `nodes` (the tuner's timed launches: random
    trees of the benches' depth)."""
    from bole_cli.timing import depth_promise

    return {"max_nodes": int(nodes), "max_depth": depth_promise("random", int(nodes))}


def build_check_case(kernel: str, dims: Mapping[str, int], device: Any = "cpu", *, act_dtype=None,
                     seed: int = 0, sizes=CHECK_SIZES) -> dict:
    """Random inputs on `device` and their float64 reference outputs (computed on the CPU)."""
    import torch

    from bole_cli.kernels import reference as ref
    from bole_cli.trees import random_forest

    act = act_dtype or torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    forest = random_forest(random.Random(seed), list(sizes))
    parents, cu = forest.to_torch("cpu")
    n, bsz = forest.n_nodes, len(sizes)
    slots_n = bsz + 2
    slots = torch.randperm(slots_n, generator=gen)[:bsz].to(torch.int32)
    r = random.Random(seed + 1)
    accepted = torch.tensor([r.randint(0, s - 1) if s else -1 for s in sizes], dtype=torch.int32)
    accepted[min(2, bsz - 1)] = -1  # one request accepts nothing: its slot must stay untouched

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    case: dict[str, Any] = {"kernel": kernel, "dims": dict(dims), "act_dtype": act, "n": n,
                            "sizes": tuple(sizes)}
    if kernel == "tree_conv":
        d, w = dims["D"], dims["W"]
        x, conv_state = rnd(n, d).to(act), rnd(slots_n, d, w - 1).to(act)
        weight, bias = rnd(d, w).to(act), rnd(d).to(act)
        case["ref_y"] = ref.tree_conv_ref(x, conv_state, weight, bias, slots, parents, cu)
        case["ref_conv_state"] = ref.tree_conv_commit_ref(conv_state, x, slots, parents, cu, accepted)
        tensors = dict(x=x, conv_state=conv_state, weight=weight, bias=bias)
    else:
        h, hv, kd, vd = dims["H"], dims["HV"], dims["K"], dims["V"]
        q, k, v = rnd(n, h, kd).to(act), rnd(n, h, kd).to(act), rnd(n, hv, vd).to(act)
        a, b = rnd(n, hv).to(act), rnd(n, hv).to(act)
        A_log, dt_bias = torch.rand(hv, generator=gen) * 2 - 1, rnd(hv)
        state = rnd(slots_n, hv, vd, kd)
        g, beta = ref.gdn_gates_ref(A_log, a, dt_bias, b)
        want = ref.tree_verify_ref(q, k, v, g, beta, state, slots, parents, cu)
        tensors = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, g=g.float(),
                       beta=beta.float())
        case["ref"] = want
        if kernel == "tree_commit_replay":  # the served commit: the path replayed from the inputs
            case["ref_state"] = ref.tree_commit_replay_ref(state, slots, k, v, g, beta, parents, cu, accepted)
        if kernel == "tree_commit":
            # the verify's factors as the commit receives them (float32), exact reference
            u32, lp32 = want.u.float(), want.log_p.float()
            tensors.update(u=u32, log_p=lp32)
            case["ref_state"] = ref.tree_commit_ref(state, slots, k, u32, lp32, parents, cu, accepted)
    tensors.update(parents=parents, cu=cu, slots=slots, accepted=accepted)
    case.update({name: t.to(device) for name, t in tensors.items()})
    return case


def _compile_errors() -> tuple:
    errs: list = []
    try:
        from triton.runtime.errors import OutOfResources

        errs.append(OutOfResources)
        from triton.runtime import errors as rt_errors

        if hasattr(rt_errors, "PTXASError"):
            errs.append(rt_errors.PTXASError)
    except ImportError:  # pragma: no cover - very old triton
        pass
    try:
        from triton.compiler.errors import CompilationError

        errs.append(CompilationError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errs)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _device_alive(device) -> None:
    """After a launch failed for a non-compile reason, make sure the CUDA context is
    still usable; a dead context would make every later measurement meaningless."""
    import torch

    if str(device).startswith("cuda"):
        try:
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            raise BoleError(f"the CUDA context failed while checking a candidate ({_first_line(exc)}); "
                            "the study is saved, re-run to resume") from exc


def run_check(kernel: str, case: dict, config: Mapping[str, int], *, kernels_mod=None,
              tol: Optional[float] = None) -> Verdict:
    """Run `kernel` with `config` on the case and compare with the reference."""
    import torch

    if kernels_mod is None:
        from bole_cli import kernels as kernels_mod
    from bole_cli.kernels.types import VerifyResult

    tol = tolerance(case["act_dtype"]) if tol is None else tol
    cfg = dict(config)
    dev = case["parents"].device
    try:
        if kernel == "tree_conv":
            y = kernels_mod.tree_conv(case["x"], case["conv_state"], case["weight"], case["bias"],
                                      case["slots"], case["parents"], case["cu"], config=cfg)
            pool = case["conv_state"].clone()
            kernels_mod.tree_conv_commit(pool, case["x"], case["slots"], case["parents"], case["cu"],
                                         case["accepted"], config=cfg)
            if str(dev).startswith("cuda"):
                torch.cuda.synchronize()
            err = rel_err(y, case["ref_y"])
            if err > tol:
                return Verdict(False, "rejected", f"y rel err {err:.1e} > {tol:g}", err)
            if not torch.equal(pool.cpu(), case["ref_conv_state"]):
                return Verdict(False, "rejected", "conv commit differs from the reference", err)
            return Verdict(True, "ok", "", err)
        if kernel == "tree_verify":
            n, hv, vd = case["v"].shape
            out = VerifyResult(torch.full_like(case["v"], float("nan")),
                               torch.full((n, hv, vd), float("nan"), device=dev),
                               torch.full((n, hv), float("nan"), device=dev))
            rows, tree = (case["q"], case["k"], case["v"]), (case["state"], case["slots"], case["parents"], case["cu"])
            gated = rows + (case["a"], case["b"], case["A_log"], case["dt_bias"]) + tree
            path = verify_path_kwargs(cfg, max(case["sizes"]))
            res = kernels_mod.tree_verify_gated(*gated, config=cfg, out=out, **path)
            # and as served, without the factors (a kernel of its own: STORE_FACTORS), gated
            # (the runtime) and ungated (the plug-in)
            served = kernels_mod.tree_verify_gated(*gated, config=cfg, out=VerifyResult.like(case["v"]),
                                                   factors=False, **path)
            plugin = kernels_mod.tree_verify(*rows, case["g"], case["beta"], *tree, config=cfg,
                                             out=VerifyResult.like(case["v"]), factors=False, **path)
            if str(dev).startswith("cuda"):
                torch.cuda.synchronize()
            want = case["ref"]
            errs = {"o": rel_err(res.o, want.o), "u": rel_err(res.u, want.u), "log_p": rel_err(res.log_p, want.log_p),
                    "o without the factors": rel_err(served.o, want.o),
                    "o ungated without the factors": rel_err(plugin.o, want.o)}
            worst = max(errs, key=errs.get)
            if errs[worst] > tol:
                return Verdict(False, "rejected", f"{worst} rel err {errs[worst]:.1e} > {tol:g}", errs[worst])
            return Verdict(True, "ok", "", errs[worst])
        if kernel in ("tree_commit", "tree_commit_replay"):
            pools = {"state": case["state"].clone()}
            tree = (case["parents"], case["cu"], case["accepted"])
            if kernel == "tree_commit":
                kernels_mod.tree_commit(pools["state"], case["slots"], case["k"], case["u"], case["log_p"], *tree,
                                        config=cfg)
            else:  # gated (the runtime) and ungated (the plug-in), under the timed promises
                promise = commit_promise(max(case["sizes"]))
                kernels_mod.tree_commit_replay_gated(pools["state"], case["slots"], case["k"], case["v"], case["a"],
                                                     case["b"], case["A_log"], case["dt_bias"], *tree, config=cfg,
                                                     **promise)
                pools["ungated state"] = case["state"].clone()
                kernels_mod.tree_commit_replay(pools["ungated state"], case["slots"], case["k"], case["v"], case["g"],
                                               case["beta"], *tree, config=cfg, **promise)
            if str(dev).startswith("cuda"):
                torch.cuda.synchronize()
            committed = {int(case["slots"][b]) for b in range(case["slots"].shape[0]) if int(case["accepted"][b]) >= 0}
            kept = [s for s in range(case["state"].shape[0]) if s not in committed]
            worst = 0.0
            for name, pool in pools.items():
                err = rel_err(pool, case["ref_state"])
                worst = max(worst, err)
                if err > tol:
                    return Verdict(False, "rejected", f"{name} rel err {err:.1e} > {tol:g}", err)
                if not torch.equal(pool[kept].cpu(), case["state"][kept].cpu()):
                    return Verdict(False, "rejected", "a slot that accepted nothing was written", err)
            return Verdict(True, "ok", "", worst)
    except InputError:
        raise  # our own call is wrong, not the config: a bug to surface
    except _compile_errors() as exc:
        return Verdict(False, "skipped", _first_line(exc))
    except Exception as exc:  # noqa: BLE001 - any other launch failure skips the config
        _device_alive(dev)
        return Verdict(False, "skipped", _first_line(exc))
    raise InputError(f"unknown kernel {kernel!r}")
