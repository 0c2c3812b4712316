"""Distributed sonicmoe (sonicmoe.parallel, FSDP2): multi-process tests with gloo on CPU (the
reference path, and where sonicmoe._C is built the kernel path on its CPU emulation), spawned here
with a free port; a one-GPU NCCL test on the kernels; the EP row gather / sum Functions alone.

Each world size runs all its scenarios in one spawn (starting processes costs most of the time
on a 2-core machine); every scenario gathers its failures instead of raising, so the ranks stay
in step, and the parent kills the workers past a deadline, so a hang fails instead of blocking.

The reference: every rank runs an unsharded copy of the model on its own tokens (same dtype, same
casts, hence the same routing decisions) and the copies' parameter gradients are summed over the
ranks, which is the gradient of the sum of every rank's loss. EP expert gradients are compared
with their slice of it, FSDP2's averaged gradients times the world size with it.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
import tempfile
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import sonicmoe
from conftest import KERNEL_GPU_SKIP_REASON, requires_extension, requires_kernel_gpu
from sonicmoe.parallel import _GatherRows, _SumRows

D, N, E, K = 32, 16, 8, 2
MODES = ("topk_softmax", "softmax_topk", "softmax_topk_norm")
DEADLINE_S = 150


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    nb = b.norm().item()
    return (a - b).norm().item() / nb if nb else (a.norm().item() and float("inf"))


class Block(nn.Module):
    """A dense projection (FSDP's "rest") and a residual MoE, optionally checkpointed."""

    def __init__(self, routing, checkpoint=False, dtype=None):
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False, dtype=dtype)
        self.moe = sonicmoe.MoE(D, N, E, K, routing=routing, dtype=dtype)
        self.checkpoint = checkpoint

    def forward(self, h):
        h = h + self.proj(h)
        if self.checkpoint:
            return h + torch.utils.checkpoint.checkpoint(self.moe, h, use_reentrant=False)
        return h + self.moe(h)


class Stack(nn.Module):
    def __init__(self, layers, routing="topk_softmax", checkpoint=False, dtype=None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(routing, checkpoint, dtype) for _ in range(layers))

    def forward(self, h):
        for block in self.blocks:
            h = block(h)
        return h


def _inputs(world, rank, tokens=12, dtype=torch.float32, seed=1):
    """Every rank's tokens drawn alike; returns this rank's x (B, S, d) and the output gradient."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(world, 2, tokens // 2, D, generator=g)
    gs = torch.randn(world, 2, tokens // 2, D, generator=g)
    return xs[rank].to(dtype), gs[rank]


def _run(model, x, grad):
    x = x.clone().requires_grad_()
    y = model(x)
    (y.float() * grad).sum().backward()
    return y.detach().float(), x.grad.float()


def _reference(model, x, grad, dtype=None):
    """An unsharded copy run on this rank's tokens; parameter gradients summed over ranks."""
    ref = copy.deepcopy(model)
    if dtype is not None:
        ref = ref.to(dtype)
        x = x.to(dtype)
    y, dx = _run(ref, x, grad)
    grads = {}
    for name, p in ref.named_parameters():
        g = p.grad.float().clone()
        dist.all_reduce(g)
        grads[name] = g
    return y, dx, grads


def _compare(failures, tag, model, y, dx, ref, tol, world, fsdp_scale=True):
    ry, rdx, rgrads = ref
    for what, a, b in (("out", y, ry), ("dx", dx, rdx)):
        if (err := rel_err(a, b)) > tol:
            failures.append(f"{tag}: {what} rel err {err:.2e} > {tol}")
    names = set()
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            failures.append(f"{tag}: {name} has no gradient")
            continue
        expert = ".experts." in f".{name}"
        if hasattr(g, "full_tensor"):  # FSDP2 averages over the data-parallel ranks
            g = g.full_tensor().float() * (world if fsdp_scale else 1)
        elif not expert:  # a replicated parameter holds its rank's tokens' part
            g = g.float().clone()
            dist.all_reduce(g)
        key = name.replace("experts.", "")
        names.add(key)
        want = rgrads[key]
        if expert:
            r = model.get_submodule(name.rsplit("experts.", 1)[0].rstrip(".")).local_expert_range
            want = want[r.start:r.stop]
        if (err := rel_err(g.float(), want)) > tol:
            failures.append(f"{tag}: grad {name} rel err {err:.2e} > {tol}")
    if names != set(rgrads):
        failures.append(f"{tag}: parameters {sorted(names)} != reference {sorted(rgrads)}")


def _ep_mesh(world):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))


def _mesh2d(dp, ep):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dp, ep), mesh_dim_names=("dp", "ep"))


def _expect_error(failures, tag, fn, *needles):
    try:
        fn()
    except (ValueError, TypeError) as exc:
        missing = [s for s in needles if s not in str(exc)]
        if missing:
            failures.append(f"{tag}: error {exc!r} lacks {missing}")
        return
    failures.append(f"{tag}: no error raised")


# Scenarios: (rank, world, failures) -> None; collectives run in the same order on every rank.

def scenario_ep_modes(rank, world, failures):
    """One EP layer per routing mode, 3-D x, fp32: outputs and all gradients match."""
    mesh = _ep_mesh(world)
    for routing in MODES:
        torch.manual_seed(0)
        moe = sonicmoe.MoE(D, N, E, K, routing=routing)
        x, g = _inputs(world, rank)
        ref = _reference(moe, x, g)
        ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), mesh)
        _compare(failures, f"ep {routing}", ep, *_run(ep, x, g), ref, 1e-5, world)
    for activation in ("geglu", "reglu"):  # from_moe carries the experts' gated activation
        torch.manual_seed(0)
        moe = sonicmoe.MoE(D, N, E, K, routing="softmax_topk_norm", activation=activation)
        x, g = _inputs(world, rank)
        ref = _reference(moe, x, g)
        ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), mesh)
        if ep.activation != activation or ep.experts.activation != activation:
            failures.append(f"ep {activation}: the layer's activation is {ep.activation!r}")
        _compare(failures, f"ep {activation}", ep, *_run(ep, x, g), ref, 1e-5, world)


def scenario_ep_stack(rank, world, failures):
    """A 2-block stack under EP, with and without activation checkpointing."""
    mesh = _ep_mesh(world)
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = Stack(2, "softmax_topk_norm", checkpoint=ckpt)
        x, g = _inputs(world, rank)
        ref = _reference(model, x, g)
        ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(model), mesh)
        _compare(failures, f"ep stack ckpt={ckpt}", ep, *_run(ep, x, g), ref, 1e-5, world)


def scenario_ep_routed(rank, world, failures):
    """moe_routed_expert_parallel with any router; an expert no rank routes to gets zero grads."""
    mesh = _ep_mesh(world)
    torch.manual_seed(0)
    w1, w2 = torch.randn(E, 2 * N, D) / D ** 0.5, torch.randn(E, D, N) / N ** 0.5
    x, g = _inputs(world, rank)
    x = x.reshape(-1, D)
    gen = torch.Generator().manual_seed(10 + rank)
    experts = torch.randint(0, E - 1, (x.shape[0], 3), generator=gen)  # expert E-1: nobody's
    scores = torch.rand(x.shape[0], 3, generator=gen)
    local = E // world
    sl = slice(rank * local, (rank + 1) * local)
    leaves = [t.clone().requires_grad_() for t in (x, w1[sl], w2[sl], scores)]
    y = sonicmoe.parallel.moe_routed_expert_parallel(leaves[0], leaves[1], leaves[2], leaves[3], experts, E, mesh)
    (y * g.reshape(-1, D)).sum().backward()
    refs = [t.clone().requires_grad_() for t in (x, w1, w2, scores)]
    ry = sonicmoe.moe_routed(refs[0], refs[1], refs[2], refs[3], experts)
    (ry * g.reshape(-1, D)).sum().backward()
    dw = [refs[1].grad.clone(), refs[2].grad.clone()]
    for t in dw:
        dist.all_reduce(t)
    for what, a, b in (("out", y, ry), ("dx", leaves[0].grad, refs[0].grad), ("dw1", leaves[1].grad, dw[0][sl]),
                       ("dw2", leaves[2].grad, dw[1][sl]), ("dscores", leaves[3].grad, refs[3].grad)):
        if (err := rel_err(a, b)) > 1e-5:
            failures.append(f"routed: {what} rel err {err:.2e}")
    if rank == world - 1 and (leaves[1].grad[-1].abs().max() != 0 or leaves[2].grad[-1].abs().max() != 0):
        failures.append("routed: the idle expert's gradient is not exactly zero")
    # activation= reaches the owners' experts
    y = sonicmoe.parallel.moe_routed_expert_parallel(x, w1[sl], w2[sl], scores, experts, E, mesh, activation="reglu")
    ry = sonicmoe.moe_routed(x, w1, w2, scores, experts, activation="reglu")
    if (err := rel_err(y, ry)) > 1e-5:
        failures.append(f"routed reglu: out rel err {err:.2e}")


def scenario_ep_edge(rank, world, failures):
    """T = 0 on rank 1; an expert no token picks (exact zero gradient)."""
    mesh = _ep_mesh(world)
    torch.manual_seed(0)
    moe = sonicmoe.MoE(D, N, E, K)
    with torch.no_grad():
        moe.router_weight[E - 1] = -5.0  # x > 0 below: expert E-1's logit is far below the rest
    x, g = _inputs(world, rank)
    x = x.abs()
    if rank == 1:
        x, g = x[:, :0], g[:, :0]
    ref = _reference(moe, x, g)
    ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), mesh)
    y, dx = _run(ep, x, g)
    if y.shape != x.shape:
        failures.append(f"edge: out shape {tuple(y.shape)} != x's {tuple(x.shape)}")
    _compare(failures, "edge", ep, y, dx, ref, 1e-5, world)
    if rank == world - 1 and (ep.experts.w1.grad[-1].abs().max() != 0 or ep.experts.w2.grad[-1].abs().max() != 0):
        failures.append("edge: the unused expert's gradient is not exactly zero")


def _grads(model):
    return {name.replace("experts.", ""): p.grad for name, p in model.named_parameters()}


def _bit_identical(failures, tag, got, want):
    """got, want: {name: tensor}; every tensor equal to the last bit."""
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            err = rel_err(g, w) if g is not None and g.shape == w.shape else None
            failures.append(f"{tag}: {name} not bit-identical (rel err {err})")


class _NoCollectives:
    """Within it, any collective of torch.distributed raises: what must not run, does not."""
    NAMES = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
             "reduce_scatter_tensor", "broadcast", "barrier")

    def __enter__(self):
        self.saved = {n: getattr(dist, n) for n in self.NAMES}

        def refuse(*args, **kwargs):
            raise AssertionError("a collective ran at ep_size 1")
        for n in self.NAMES:
            setattr(dist, n, refuse)
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(dist, n, f)


def _ep_one_vs_moe(failures, tag, moe, x, g, logits_loss=False):
    """EP at ep_size 1 against moe itself (same weights): output, dx and every gradient bit-identical,
    with no collective in forward or backward."""
    def run(model, guard):
        xx = x.clone().requires_grad_()
        with guard:
            out = model(xx)
            y, logits = out if isinstance(out, tuple) else (out, None)
            loss = (y.float() * g).sum() + (logits.float().square().mean() if logits_loss else 0)
            loss.backward()
        return {"out": y.detach(), "dx": xx.grad, **_grads(model)}

    import contextlib
    ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), _ep_mesh(1))
    want = run(copy.deepcopy(moe), contextlib.nullcontext())
    _bit_identical(failures, tag, run(ep, _NoCollectives()), want)


def scenario_ep_one(rank, world, failures):
    """ep_size 1: the single-GPU path as is: bit-identical to MoE and moe_routed, no collective;
    a bad x raises its own error at once."""
    for routing in MODES:
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            moe = sonicmoe.MoE(D, N, E, K, routing=routing, dtype=dtype)
            x, g = _inputs(1, 0, dtype=dtype)
            _ep_one_vs_moe(failures, f"ep1 {routing} {dtype}", moe, x, g)
    torch.manual_seed(0)
    moe = sonicmoe.MoE(D, N, E, K, return_router_logits=True)
    x, g = _inputs(1, 0)
    _ep_one_vs_moe(failures, "ep1 router logits", moe, x, g, logits_loss=True)
    # moe_routed_expert_parallel against moe_routed.
    w1, w2 = torch.randn(E, 2 * N, D) / D ** 0.5, torch.randn(E, D, N) / N ** 0.5
    x2 = x.reshape(-1, D)
    gen = torch.Generator().manual_seed(10)
    experts = torch.randint(0, E, (x2.shape[0], 3), generator=gen)
    scores = torch.rand(x2.shape[0], 3, generator=gen)
    runs = []
    for fn in (lambda *a: sonicmoe.moe_routed(*a, experts),
               lambda *a: sonicmoe.parallel.moe_routed_expert_parallel(*a, experts, E, _ep_mesh(1))):
        leaves = [t.clone().requires_grad_() for t in (x2, w1, w2, scores)]
        with _NoCollectives():
            y = fn(*leaves)
            (y * g.reshape(-1, D)).sum().backward()
        runs.append({"out": y.detach(), **{n: t.grad for n, t in zip(("dx", "dw1", "dw2", "dscores"), leaves)}})
    _bit_identical(failures, "ep1 routed", runs[1], runs[0])
    # The local checks raise directly (nothing to exchange).
    ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), _ep_mesh(1))
    with _NoCollectives():
        _expect_error(failures, "ep1 bad x", lambda: ep(x[..., : D - 1]), "x.shape[-1]", str(D - 1))
        _expect_error(failures, "ep1 routed bad ids", lambda: sonicmoe.parallel.moe_routed_expert_parallel(
            x2, w1, w2, scores, experts.float(), E, _ep_mesh(1)), "integer dtype")


def scenario_ep_bf16(rank, world, failures):
    """EP in bf16 against the unsharded layer in bf16 (same routing decisions), and run-to-run
    bit-identical (the row sums have a fixed order)."""
    mesh = _ep_mesh(world)
    torch.manual_seed(0)
    moe = sonicmoe.MoE(D, N, E, K, routing="softmax_topk", dtype=torch.bfloat16)
    x, g = _inputs(world, rank, tokens=16, dtype=torch.bfloat16)
    ref = _reference(moe, x, g)
    ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), mesh)
    runs = []
    for _ in range(2):
        for p in ep.parameters():
            p.grad = None
        y, dx = _run(ep, x, g)
        runs.append({"out": y, "dx": dx, **{k: v.clone() for k, v in _grads(ep).items()}})
    _compare(failures, "ep bf16", ep, y, dx, ref, 1e-2, world)
    _bit_identical(failures, "ep bf16 rerun", runs[1], runs[0])


def scenario_ep_emulated(rank, world, failures):
    """The layer's kernel path on the CPU emulation of the ops (bf16): EP over the world against
    the unsharded layer on the same ops; at ep_size 1 bit-identical to MoE, no collective."""
    from kernel_emulation import emulated_kernels
    with emulated_kernels():
        mesh = _ep_mesh(world)
        for routing in MODES:
            torch.manual_seed(0)
            moe = sonicmoe.MoE(D, N, E, K, routing=routing, dtype=torch.bfloat16)
            x, g = _inputs(world, rank, tokens=16, dtype=torch.bfloat16)
            if world == 1:
                _ep_one_vs_moe(failures, f"emulated ep1 {routing}", moe, x, g)
                continue
            ref = _reference(moe, x, g)
            ep = sonicmoe.parallel.parallelize_moe(copy.deepcopy(moe), mesh)
            _compare(failures, f"emulated ep {routing}", ep, *_run(ep, x, g), ref, 1e-2, world)


def scenario_bad_input(rank, world, failures):
    """Clear errors, on every rank together, never a hang; the group stays usable after."""
    from sonicmoe.parallel import ExpertParallelMoE, fully_shard_moe, parallelize_moe
    mesh = _ep_mesh(world)
    _expect_error(failures, "E % ep", lambda: ExpertParallelMoE(D, N, world * 2 + 1, K, mesh),
                  "num_experts", str(world * 2 + 1), "divisible")
    _expect_error(failures, "token_rounding", lambda: ExpertParallelMoE(D, N, E, K, mesh, routing="token_rounding"),
                  "token_rounding", "expert parallelism")
    _expect_error(failures, "2-D ep_mesh", lambda: ExpertParallelMoE(D, N, E, K, _mesh2d(1, world)), "ndim")
    torch.manual_seed(0)
    moe = sonicmoe.MoE(D, N, E, K)
    ep = parallelize_moe(copy.deepcopy(moe), mesh)
    # Mismatched meshes: the layer's EP group is not mesh["ep"]; a 1-D mesh for an EP model.
    _expect_error(failures, "mesh mismatch", lambda: fully_shard_moe(ep, _mesh2d(world, 1)), "mesh['ep']")
    _expect_error(failures, "1-D mesh", lambda: fully_shard_moe(ep, mesh), "mesh.ndim = 1")
    # One rank's bad x: every rank raises after the count exchange.
    x, _ = _inputs(world, rank)
    bad = x[..., : D - 1] if rank == 0 else x
    _expect_error(failures, "bad x", lambda: ep(bad), "x.shape[-1]" if rank == 0 else "EP ranks [0] refused")
    _expect_error(failures, "bad dtype", lambda: ep(x.double() if rank == world - 1 else x),
                  "dtype" if rank == world - 1 else f"EP ranks [{world - 1}] refused")
    # moe_routed_expert_parallel: one rank's float expert ids.
    w1, w2 = ep.experts.w1.detach(), ep.experts.w2.detach()
    x2 = x.reshape(-1, D)
    ids = torch.zeros(x2.shape[0], K, dtype=torch.float32 if rank == 0 else torch.int64)
    _expect_error(failures, "routed bad ids", lambda: sonicmoe.parallel.moe_routed_expert_parallel(
        x2, w1, w2, torch.ones(x2.shape[0], K), ids, E, mesh), "integer dtype" if rank == 0 else "refused")
    # Ranks disagreeing on the config (top_k): all raise.
    other = parallelize_moe(copy.deepcopy(moe), mesh)
    other.top_k = K + rank
    _expect_error(failures, "config mismatch", lambda: other(x), "disagree", "top_k")
    other = parallelize_moe(copy.deepcopy(moe), mesh)
    other.experts.activation = "geglu" if rank == 0 else "swiglu"
    _expect_error(failures, "activation mismatch", lambda: other(x), "disagree", "activation")
    # The group still works.
    y, _ = _run(ep, x, torch.zeros_like(x))
    if (err := rel_err(y, moe(x).detach())) > 1e-5:
        failures.append(f"after errors: out rel err {err:.2e}")


def scenario_fsdp(rank, world, failures):
    """FSDP2 over a MoE and a stack: fp32; bf16 compute with fp32 reduce; bf16 parameters;
    activation checkpointing. The reference runs the same dtype on the rank's tokens."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.device_mesh import init_device_mesh
    from sonicmoe.parallel import fully_shard_moe
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    mp_bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    cases = (("moe fp32", lambda: sonicmoe.MoE(D, N, E, K), None, None, 1e-5),
             ("stack fp32", lambda: Stack(2), None, None, 1e-5),
             ("moe mp-bf16", lambda: sonicmoe.MoE(D, N, E, K, routing="softmax_topk"), mp_bf16, torch.bfloat16, 1e-2),
             ("stack mp-bf16 ckpt", lambda: Stack(2, checkpoint=True), mp_bf16, torch.bfloat16, 1e-2),
             ("stack bf16 params", lambda: Stack(2, dtype=torch.bfloat16), None, torch.bfloat16, 1e-2))
    for tag, make, policy, dtype, tol in cases:
        torch.manual_seed(0)
        model = make()
        x, g = _inputs(world, rank, dtype=dtype or torch.float32)
        ref = _reference(model, x, g, dtype)
        layout = []
        for m in model.modules():
            if isinstance(m, sonicmoe.MoE):  # what the kernels would get: contiguous, 16-byte aligned
                m.register_forward_pre_hook(lambda mod, args: layout.append(
                    (mod.w1.is_contiguous() and mod.w2.is_contiguous(), mod.w1.data_ptr() % 16, mod.w2.data_ptr() % 16,
                     mod.w1.dtype)))
        fully_shard_moe(model, mesh, mp_policy=policy)
        _compare(failures, f"fsdp {tag}", model, *_run(model, x, g), ref, tol, world)
        want = (True, 0, 0, dtype or torch.float32)
        if not layout or any(seen != want for seen in layout):
            failures.append(f"fsdp {tag}: unsharded w1/w2 layout {layout[:2]} != {want}")


def scenario_fsdp_ep(rank, world, failures):
    """EP × FSDP2 on 2-D meshes (dp, ep): experts split by EP, sharded over dp; the rest over all."""
    from sonicmoe.parallel import fully_shard_moe, parallelize_moe
    from torch.distributed.fsdp import MixedPrecisionPolicy
    shapes = [(1, world), (world, 1)] + ([(2, world // 2)] if world >= 4 else [])
    for dp, ep_size in shapes:
        mesh = _mesh2d(dp, ep_size)
        for policy, dtype, tol in ((None, None, 1e-5),
                                   (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                                    torch.bfloat16, 1e-2)):
            torch.manual_seed(0)
            model = Stack(2, "softmax_topk")
            x, g = _inputs(world, rank)
            ref = _reference(model, x, g, dtype)
            parallelize_moe(model, mesh["ep"])
            fully_shard_moe(model, mesh, mp_policy=policy)
            _compare(failures, f"fsdp x ep ({dp}, {ep_size}) {dtype}", model, *_run(model, x, g), ref, tol, world)


def scenario_fsdp_compile(rank, world, failures):
    """torch.compile over an FSDP2 stack (aot_eager: Dynamo and AOT autograd in ~7 s; Inductor also
    passes on CPU but compiles for ~35 s here). The CPU reference path breaks the graph at its host
    reads, as expected."""
    from torch.distributed.device_mesh import init_device_mesh
    from sonicmoe.parallel import fully_shard_moe
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = Stack(2)
    x, g = _inputs(world, rank)
    ref = _reference(model, x, g)
    fully_shard_moe(model, mesh)
    compiled = torch.compile(model, backend="aot_eager")
    _compare(failures, "fsdp compile", model, *_run(compiled, x, g), ref, 1e-5, world)


SCENARIOS = {f.__name__[len("scenario_"):]: f for f in (
    scenario_ep_modes, scenario_ep_stack, scenario_ep_routed, scenario_ep_edge, scenario_ep_one, scenario_ep_bf16,
    scenario_ep_emulated, scenario_bad_input, scenario_fsdp, scenario_fsdp_ep, scenario_fsdp_compile)}
# The kernel path's emulation needs sonicmoe._C (the ops' schemas).
EMULATED = ["ep_emulated"] if sonicmoe.extension_available() else []
WORLD_SCENARIOS = {
    1: ["ep_one", "fsdp_ep"] + EMULATED,
    2: [n for n in SCENARIOS if n not in ("ep_one", "ep_emulated")] + EMULATED,
    4: ["ep_modes", "ep_edge", "bad_input", "fsdp", "fsdp_ep"],
}


def _worker(rank, world, port, names, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # A collective that waits past this fails instead of hanging.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results = {}
    for name in names:
        failures, start = [], time.time()
        try:
            SCENARIOS[name](rank, world, failures)
        except Exception:  # noqa: BLE001 - reported to the parent
            failures.append(traceback.format_exc())
        results[name] = {"failures": failures, "seconds": round(time.time() - start, 2)}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def spawn(world, names, target=_worker, deadline=DEADLINE_S):
    """Run names on world gloo processes; returns {name: [failures of every rank]}."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        port = _free_port()
        procs = [ctx.Process(target=target, args=(r, world, port, names, out_dir)) for r in range(world)]
        for p in procs:
            p.start()
        end = time.time() + deadline
        for p in procs:
            p.join(max(0.0, end - time.time()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        merged = {name: [] for name in names}
        for r in range(world):
            path = os.path.join(out_dir, f"rank{r}.json")
            done = json.load(open(path)) if os.path.exists(path) else {}
            for name in names:
                if name not in done:
                    merged[name].append(f"rank {r}: did not finish" + (" (killed at the deadline)" if hung else ""))
                else:
                    merged[name] += [f"rank {r}: {m}" for m in done[name]["failures"]]
        return merged


_results = {}


def _world(world):
    if world not in _results:
        _results[world] = spawn(world, WORLD_SCENARIOS[world])
    return _results[world]


@pytest.mark.parametrize("world,name", [(w, n) for w, names in WORLD_SCENARIOS.items() for n in names])
def test_distributed_cpu(world, name):
    failures = _world(world)[name]
    assert not failures, "\n".join(failures)


def _rows_case(T, K, dtype, seed=0):
    """A (T, K) routing's send layout as _dispatch_combine builds it: each row's token idx (T·K,)
    and each (t, k)'s row pos (T, K) int32."""
    gen = torch.Generator().manual_seed(seed)
    experts = torch.randint(0, 4, (T, K), generator=gen)
    order = torch.sort(experts.reshape(-1), stable=True).indices
    pos = torch.empty(T * K, dtype=torch.int32)
    pos[order] = torch.arange(T * K, dtype=torch.int32)
    src = torch.randn(T, D, generator=gen).to(dtype)
    rows = torch.randn(T * K, D, generator=gen).to(dtype)
    return src, rows, torch.div(order, K, rounding_mode="floor"), pos.view(T, K)


@pytest.mark.parametrize("T,K", [(7, 3), (5, 1), (0, 2)])
def test_gather_sum_rows(T, K):
    """_GatherRows / _SumRows against plain torch (index_select under autograd, a gather and a sum):
    values and gradients; gradcheck and gradgradcheck (each one's backward is the other)."""
    src, rows, idx, pos = _rows_case(T, K, torch.float64)
    src.requires_grad_()
    rows.requires_grad_()
    gather = _GatherRows.apply(src, idx, pos)
    summed = _SumRows.apply(rows, pos, idx, (1, T, D))
    assert torch.equal(gather, src.index_select(0, idx))
    plain_sum = rows.index_select(0, pos.reshape(-1).long()).view(T, K, D).sum(1).view(1, T, D)
    torch.testing.assert_close(summed, plain_sum, rtol=1e-12, atol=1e-12)
    assert not summed._is_view()  # FSDP2: an in-place op on a view output would skip its hook
    g_rows, g_out = torch.randn_like(gather), torch.randn_like(summed)
    got = torch.autograd.grad((gather * g_rows).sum() + (summed * g_out).sum(), (src, rows))
    want = torch.autograd.grad((src.index_select(0, idx) * g_rows).sum() + (plain_sum * g_out).sum(), (src, rows))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if T:
        assert torch.autograd.gradcheck(lambda s: _GatherRows.apply(s, idx, pos), (src,))
        assert torch.autograd.gradcheck(lambda r: _SumRows.apply(r, pos, idx, (T, D)), (rows,))
        assert torch.autograd.gradgradcheck(lambda s: _GatherRows.apply(s, idx, pos), (src,))
        assert torch.autograd.gradgradcheck(lambda r: _SumRows.apply(r, pos, idx, (T, D)), (rows,))


def test_gather_rows_backward_rounds_once():
    """bf16: the gather's backward sums each token's K gradient rows in fp32 and rounds once, in a
    fixed order (autograd's index_add_ on CUDA rounds after every add, on atomics)."""
    T, K = 64, 8
    src, _, idx, pos = _rows_case(T, K, torch.bfloat16, seed=3)
    src.requires_grad_()
    g = torch.randn(T * K, D, generator=torch.Generator().manual_seed(4)).bfloat16()
    _GatherRows.apply(src, idx, pos).backward(g)
    once = torch.zeros(T, D, dtype=torch.float64).index_add_(0, idx, g.double()).bfloat16()
    assert torch.equal(src.grad, once)


@requires_extension
def test_sum_rows_on_combine_dx():
    """On the kernel path (bf16, the ops' CPU emulation) the sums are K8 (combine_dx), with the same
    values as the torch formulation, both directions."""
    from kernel_emulation import emulated_kernels
    import sonicmoe.parallel as parallel
    T, K = 9, 3
    src, rows, idx, pos = _rows_case(T, K, torch.bfloat16, seed=5)
    g = torch.randn(T, D, generator=torch.Generator().manual_seed(6)).bfloat16()

    def run():
        r, s = rows.clone().requires_grad_(), src.clone().requires_grad_()
        out = _SumRows.apply(r, pos, idx, (T, D))
        out.backward(g)
        _GatherRows.apply(s, idx, pos).backward(torch.ones(T * K, D, dtype=torch.bfloat16))
        return out.detach(), r.grad, s.grad

    want = run()
    calls = []
    real = parallel.combine_dx
    parallel.combine_dx = lambda *a: calls.append(1) or real(*a)
    try:
        with emulated_kernels():
            got = run()
    finally:
        parallel.combine_dx = real
    assert len(calls) == 2  # the return sum and the gather's backward
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _gpu_worker(rank, world, port, names, out_dir):
    """World size 1, NCCL, the kernels in bf16: EP at ep_size 1 and FSDP2 against the plain layer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from sonicmoe.parallel import fully_shard_moe, parallelize_moe
    failures = []
    try:
        d, n, e, k, t = 512, 256, 16, 4, 2048
        for routing in MODES:
            torch.manual_seed(0)
            moe = sonicmoe.MoE(d, n, e, k, routing=routing, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(t, d, device="cuda")
            runs = {}
            for tag in ("plain", "ep", "fsdp"):
                model = copy.deepcopy(moe)
                if tag == "ep":
                    model = parallelize_moe(model, init_device_mesh("cuda", (1,)))
                elif tag == "fsdp":
                    fully_shard_moe(model, init_device_mesh("cuda", (1,)),
                                    mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                   reduce_dtype=torch.float32))
                xx = x.clone().requires_grad_()
                y = model(xx)
                (y.float() * g).sum().backward()
                grads = {nm.replace("experts.", ""): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                                                      else p.grad).float() for nm, p in model.named_parameters()}
                runs[tag] = (y.float(), xx.grad.float(), grads)
            for tag in ("ep", "fsdp"):
                for what, a, b in (("out", runs[tag][0], runs["plain"][0]), ("dx", runs[tag][1], runs["plain"][1])):
                    if (err := rel_err(a, b)) > 1e-2:
                        failures.append(f"{routing} {tag} {what}: rel err {err:.2e}")
                for nm, want in runs["plain"][2].items():
                    if (err := rel_err(runs[tag][2][nm], want)) > 1e-2:
                        failures.append(f"{routing} {tag} grad {nm}: rel err {err:.2e}")
    except Exception:  # noqa: BLE001
        failures.append(traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"gpu": {"failures": failures, "seconds": 0}}, f)
    dist.destroy_process_group()


@requires_kernel_gpu
def test_one_gpu_nccl_kernels():
    assert KERNEL_GPU_SKIP_REASON is None
    failures = spawn(1, ["gpu"], target=_gpu_worker, deadline=300)["gpu"]
    assert not failures, "\n".join(failures)


def test_benchmark_counts_nccl_kernels_by_collective():
    # The scaling benchmark's communication share: NCCL's all_to_all_single runs as grouped send /
    # receive (SendRecv; AllToAll in older NCCL); FSDP2's collectives are the rest.
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "benchmarks", "distributed.py")
    spec = importlib.util.spec_from_file_location("distributed_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    kind = bench._nccl_kind
    assert kind("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "all_to_all"
    assert kind("ncclKernel_AllToAll_RING_LL_Sum_int8_t") == "all_to_all"
    assert kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "other"
    assert kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "other"
    assert kind("void sonicmoe::combine_kernel<8>(...)") is None


def test_benchmark_script_cpu(tmp_path):
    """benchmarks/distributed.py under torchrun, gloo, world 2, tiny config: runs, checks, writes JSON."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "dist.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), os.path.join(root, "benchmarks", "distributed.py"), "--device", "cpu", "--tiny",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert all(v["ok"] for v in result["check"].values()), result["check"]
    assert all(isinstance(v["worst"], str) for v in result["check"].values()), result["check"]
    assert [r["mode"] for r in result["rows"]] == ["plain", "ep", "fsdp", "fsdp_ep"]
    assert all(r["tokens_per_s_per_rank"] > 0 for r in result["rows"])
