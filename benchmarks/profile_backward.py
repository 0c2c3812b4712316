"""Kernel list of one sonicmoe.moe backward on the GPU (torch profiler; gradients unset first, as
optimizer.zero_grad leaves them), per config: where the backward's time goes.

    python benchmarks/profile_backward.py [paper-30b-n512] [qwen3-235b-a22b] [olmoe-1b-7b] [qwen3-30b-a3b]
"""
import sys

import torch
sys.path.insert(0, "python")  # run from the repository root
import sonicmoe
from torch.profiler import profile, ProfilerActivity

CFGS = {"paper-30b-n512": (32768, 4096, 512, 128, 8), "qwen3-235b-a22b": (32768, 4096, 1536, 128, 8),
        "olmoe-1b-7b": (32768, 2048, 1024, 64, 8), "qwen3-30b-a3b": (32768, 2048, 768, 128, 8)}
for name in sys.argv[1:] or CFGS:
    T, d, n, E, K = CFGS[name]
    x = torch.randn(T, d, device="cuda").bfloat16().requires_grad_()
    router = (torch.randn(E, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16().requires_grad_()
    grad = torch.randn(T, d, device="cuda").bfloat16()
    for _ in range(3):
        for t in (x, router, w1, w2):
            t.grad = None
        sonicmoe.moe(x, router, w1, w2, K).backward(grad)
    for t in (x, router, w1, w2):
        t.grad = None
    out = sonicmoe.moe(x, router, w1, w2, K)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in events)
    print(f"== {name} backward: {len(events)} kernels/copies, {total/1e3:.3f} ms device time")
    for e in events:
        print(f"  {e.device_time:9.1f} us  {e.name[:110]}")
    del x, router, w1, w2, grad, out
    torch.cuda.empty_cache()
