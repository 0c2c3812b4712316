"""Distributed SonicMoE: correctness and throughput of expert parallelism and FSDP2.

    torchrun --nproc-per-node N benchmarks/distributed.py [--out dist.json]
    torchrun --nproc-per-node 2 benchmarks/distributed.py --device cpu --tiny   # gloo, the script itself

(a) Correctness on N ranks: EP over all ranks, FSDP2 (bf16 compute, fp32 reduce), and both on a
    2-D (dp, ep) mesh, against the single-GPU layer: every rank runs an unsharded copy of one MoE
    layer on its own tokens (same casts, same routing decisions), whose parameter gradients summed
    over the ranks are the reference (EP experts: their slice; FSDP2's averages: times N). Relative
    Frobenius error <= 1e-2 for the output and every gradient (docs/design.md §7); the worst
    tensor is reported by name.
(b) Throughput: forward + backward of a stack of MoE layers at T tokens per rank, per mode:
    plain (the single-GPU layer, no communication), ep (ExpertParallelMoE over all N ranks: E / N
    experts each), fsdp (FSDP2 over N ranks, bf16 compute), fsdp_ep (2-D mesh). At N = 1 "ep" is
    the EP wrapper at ep_size 1 against "plain". Tokens/s per rank (medians over --iters), the
    peak memory and the memory kept from forward to backward per rank, and where the step's time
    goes: the NCCL kernels of one more (profiled) step, all-to-all (EP's row exchange) and the
    other collectives (FSDP2's all-gathers and reduce-scatters), as ms and as shares of the median
    step (CUDA only: kernel time, overlapped with compute or not, so an upper bound on what the
    communication adds), as a table and as JSON (--out).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

import sonicmoe  # noqa: E402
from sonicmoe.parallel import fully_shard_moe, parallelize_moe  # noqa: E402

MODES = ("plain", "ep", "fsdp", "fsdp_ep")


class Stack(nn.Module):
    """layers residual MoE blocks (the MoE layer is the whole block: what is measured)."""

    def __init__(self, layers, d, n, E, K, routing, device, dtype):
        super().__init__()
        self.layers = nn.ModuleList(sonicmoe.MoE(d, n, E, K, routing=routing, device=device, dtype=dtype)
                                    for _ in range(layers))

    def forward(self, h):
        for layer in self.layers:
            h = h + layer(h)
        return h


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tokens", "-T", type=int, default=24576, help="tokens per rank")
    p.add_argument("--d", type=int, default=1536)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--experts", "-E", type=int, default=128)
    p.add_argument("--top-k", "-K", type=int, default=8)
    p.add_argument("--layers", type=int, default=2, help="MoE layers in the stack")
    p.add_argument("--routing", default="topk_softmax", choices=("topk_softmax", "softmax_topk", "softmax_topk_norm"))
    p.add_argument("--ep", type=int, default=0, help="EP size of the 2-D mesh (default: N / 2, or N where N < 4)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip-check", action="store_true", help="skip (a), the correctness check")
    p.add_argument("--check-only", action="store_true", help="run (a) only")
    p.add_argument("--tiny", action="store_true", help="T 64, d 32, n 16, E 8, K 2, 2 iterations (CPU test)")
    p.add_argument("--out", help="write the results as JSON here (rank 0)")
    args = p.parse_args(argv)
    if args.tiny:
        args.tokens, args.d, args.n, args.experts, args.top_k, args.warmup, args.iters = 64, 32, 16, 8, 2, 1, 2
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {MODES}")
    return args


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    nb = b.norm().item()
    return (a - b).norm().item() / nb if nb else (0.0 if a.norm().item() == 0 else float("inf"))


def meshes(args, world):
    from torch.distributed.device_mesh import init_device_mesh
    ep = args.ep or (world // 2 if world >= 4 else world)
    if world % ep:
        raise ValueError(f"--ep = {ep} breaks the rule: must divide the world size {world}")
    if args.experts % world or args.experts % ep:
        raise ValueError(f"--experts = {args.experts} breaks the rule: must be divisible by the EP sizes {world} "
                         f"and {ep}")
    return {"ep": init_device_mesh(args.device, (world,), mesh_dim_names=("ep",)),
            "dp": init_device_mesh(args.device, (world,), mesh_dim_names=("dp",)),
            "2d": init_device_mesh(args.device, (world // ep, ep), mesh_dim_names=("dp", "ep"))}


def build(mode, base, mesh, dtype):
    """The mode's model from base (an unsharded Stack, every rank alike)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    model = copy.deepcopy(base)
    if mode == "plain":
        return model.to(dtype)
    if mode == "ep":
        return parallelize_moe(model.to(dtype), mesh["ep"])
    if mode == "fsdp":
        return fully_shard_moe(model, mesh["dp"], mp_policy=policy)
    parallelize_moe(model, mesh["2d"]["ep"])
    return fully_shard_moe(model, mesh["2d"], mp_policy=policy)


def check(args, mesh, world, rank, device, dtype):
    """(a): {mode: (name of the worst tensor, its relative error)} over the output, dx and every
    parameter gradient, the worst over the ranks."""
    torch.manual_seed(0)
    T = min(args.tokens, 2048)
    # One layer: a second one routes on the first one's bf16 output, where a last-bit difference
    # between two correct implementations flips near-tie top-K choices and the comparison then
    # fails by a few % (docs/design.md §7: compare with the same routing decisions).
    base = Stack(1, args.d, args.n, args.experts, args.top_k, args.routing, device, torch.float32)
    g = torch.Generator(device="cpu").manual_seed(1 + rank)
    x = torch.randn(T, args.d, generator=g).to(device, dtype)
    grad = torch.randn(T, args.d, generator=g).to(device)

    def run(model):
        xx = x.clone().requires_grad_()
        y = model(xx)
        (y.float() * grad).sum().backward()
        return y.float(), xx.grad.float()

    ref = base.to(dtype)
    ry, rdx = run(ref)
    rgrads = {}
    for name, p in ref.named_parameters():
        t = p.grad.float().clone()
        dist.all_reduce(t)
        rgrads[name] = t
    worst = {}
    for mode in ("ep", "fsdp", "fsdp_ep"):
        model = build(mode, _fp32_copy(ref), mesh, dtype)
        y, dx = run(model)
        errs = {"out": rel_err(y, ry), "dx": rel_err(dx, rdx)}
        for name, p in model.named_parameters():
            gr = p.grad
            expert = "experts." in name
            if hasattr(gr, "full_tensor"):
                gr = gr.full_tensor().float() * world
            elif not expert:
                gr = gr.float().clone()
                dist.all_reduce(gr)
            want = rgrads[name.replace("experts.", "")]
            if expert:
                r = model.get_submodule(name.rsplit("experts.", 1)[0].rstrip(".")).local_expert_range
                want = want[r.start:r.stop]
            errs[name] = rel_err(gr.float(), want)
        # Every rank has the same names (the same model), so an element-wise max names the worst.
        names = sorted(errs)
        over_ranks = torch.tensor([errs[k] for k in names], dtype=torch.float64, device=device)
        dist.all_reduce(over_ranks, op=dist.ReduceOp.MAX)
        i = int(over_ranks.argmax())
        worst[mode] = (names[i], over_ranks[i].item())
    return worst


def _fp32_copy(model):
    model = copy.deepcopy(model).float()
    for p in model.parameters():
        p.grad = None
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# NCCL's kernels by collective: all_to_all_single runs as grouped send / receive (SendRecv), older
# NCCL as AllToAll; the rest (AllGather, ReduceScatter, AllReduce, Broadcast) are "other".
def _nccl_kind(kernel_name):
    if not kernel_name.startswith("nccl"):
        return None
    return "all_to_all" if "SendRecv" in kernel_name or "AllToAll" in kernel_name else "other"


def comm_ms(step):
    """ms of NCCL kernel time in one call of step(), by _nccl_kind (CUDA)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    ms = {"all_to_all": 0.0, "other": 0.0}
    for e in prof.events():
        kind = _nccl_kind(e.name) if e.device_type == torch.autograd.DeviceType.CUDA else None
        if kind:
            ms[kind] += e.device_time / 1e3
    return ms


def throughput(args, mode, mesh, world, device, dtype):
    torch.manual_seed(0)
    base = Stack(args.layers, args.d, args.n, args.experts, args.top_k, args.routing, device, torch.float32)
    model = build(mode, base, mesh, dtype)
    del base
    x = torch.randn(args.tokens, args.d, device=device, dtype=dtype)
    grad = torch.randn(args.tokens, args.d, device=device, dtype=dtype)
    cuda = device.type == "cuda"
    times, kept = [], None
    for i in range(args.warmup + args.iters):
        xx = x.clone().requires_grad_()
        dist.barrier()
        sync(device)
        if cuda:
            before = torch.cuda.memory_allocated(device)
            if i == args.warmup:
                torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        y = model(xx)
        if cuda and kept is None and i >= args.warmup:
            kept = torch.cuda.memory_allocated(device) - before
        y.backward(grad)
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
        for p in model.parameters():
            p.grad = None
    seconds = statistics.median(times)
    rate = torch.tensor([args.tokens / seconds], dtype=torch.float64, device=device)
    dist.all_reduce(rate)  # mean over ranks
    row = {"mode": mode, "world": world, "tokens_per_s_per_rank": rate.item() / world,
           "step_ms_rank0": seconds * 1e3}
    if cuda:
        row["peak_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
        row["kept_mem_GiB"] = kept / 2**30

        def step():
            model(x.clone().requires_grad_()).backward(grad)
            for p in model.parameters():
                p.grad = None

        dist.barrier()
        sync(device)
        ms = comm_ms(step)
        row.update({f"{k}_ms_rank0": v for k, v in ms.items()})
        row.update({f"{k}_share_rank0": v / row["step_ms_rank0"] for k, v in ms.items()})
    return row


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, backend, dtype = torch.device("cuda", local), "nccl", torch.bfloat16
    else:
        device, backend, dtype = torch.device("cpu"), "gloo", torch.float32  # the reference path
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = meshes(args, world)
    result = {"config": {k: getattr(args, k) for k in ("device", "tokens", "d", "n", "experts", "top_k", "layers",
                                                       "routing")},
              "world": world, "ep_2d": mesh["2d"]["ep"].size(), "dtype": str(dtype)}
    if not args.skip_check:
        worst = check(args, mesh, world, rank, device, dtype)
        result["check"] = {m: {"worst_rel_err": e, "worst": name, "ok": e <= 1e-2} for m, (name, e) in worst.items()}
        if rank == 0:
            for m, (name, e) in worst.items():
                print(f"check {m:8s} worst rel err {e:.2e} ({name}) {'ok' if e <= 1e-2 else 'FAIL'}")
    if not args.check_only:
        rows = [throughput(args, mode, mesh, world, device, dtype) for mode in args.modes]
        result["rows"] = rows
        if rank == 0:
            cfg = result["config"]
            print(f"T {cfg['tokens']} per rank, d {cfg['d']}, n {cfg['n']}, E {cfg['experts']}, K {cfg['top_k']}, "
                  f"{cfg['layers']} layers, {world} ranks, {dtype}")
            print(f"{'mode':8s} {'tokens/s/rank':>14s} {'step ms':>9s} {'peak GiB':>9s} {'kept GiB':>9s} "
                  f"{'a2a ms':>8s} {'share':>6s} {'other ms':>9s} {'share':>6s}")
            nan = float("nan")
            for r in rows:
                print(f"{r['mode']:8s} {r['tokens_per_s_per_rank']:14.0f} {r['step_ms_rank0']:9.2f} "
                      f"{r.get('peak_mem_GiB', nan):9.2f} {r.get('kept_mem_GiB', nan):9.2f} "
                      f"{r.get('all_to_all_ms_rank0', nan):8.2f} {r.get('all_to_all_share_rank0', nan):6.1%} "
                      f"{r.get('other_ms_rank0', nan):9.2f} {r.get('other_share_rank0', nan):6.1%}")
    if rank == 0 and args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    dist.destroy_process_group()
    ok = all(v["ok"] for v in result.get("check", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Leave as multiprocessing's workers do (os._exit), without the C++ static destructors: after a
    # finished run they aborted a gloo rank now and then (std::terminate on a joinable thread, after
    # the atexit handlers; 8 of 95 CPU runs under load). The results are written and the process
    # groups destroyed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
