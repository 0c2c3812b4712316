"""SonicMoE demo.

On a Hopper GPU: route a batch of tokens with a real top-K router, lay the rows out by expert
(sonicmoe.routing_metadata, on the device) and run the down-projection grouped GEMM
(sonicmoe.grouped_gemm) against torch._grouped_mm, printing throughput and the error against
fp32. The fused MoE layer itself lands with the forward issue.

Elsewhere: says so, and runs the pure-PyTorch reference MoE (sonicmoe.reference) on a small
config on the CPU.
"""

import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import sonicmoe  # noqa: E402

# qwen3-30b-a3b's expert shape (shared/anchors), at a training batch of 32768 tokens.
T, D, N, E, K = 32768, 2048, 768, 128, 8


def gpu_demo():
    torch.manual_seed(0)
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    router = torch.randn(E, D, device="cuda", dtype=torch.bfloat16) * D**-0.5
    w2 = (torch.randn(E, D, N, device="cuda") * N**-0.5).bfloat16()
    scores, experts = sonicmoe.reference.route(x, router, K, routing="softmax_topk_norm")
    meta = sonicmoe.routing_metadata(experts, E)
    counts = meta.expert_offsets.diff()
    # Stand-in for the SwiGLU activations A (T*K x n), already in the sorted layout.
    a = torch.randn(T * K, N, device="cuda", dtype=torch.bfloat16)

    def run_ours():
        return sonicmoe.grouped_gemm(a, w2, meta.expert_offsets)

    def run_torch():
        return torch._grouped_mm(a, w2.transpose(1, 2), offs=meta.expert_offsets[1:])

    out = run_ours()
    ref = torch.cat([a[lo:hi].float() @ w2[e].float().t() for e, (lo, hi) in
                     enumerate(zip(meta.expert_offsets[:-1].tolist(), meta.expert_offsets[1:].tolist()))])
    err = float((out.float() - ref).norm() / ref.norm())

    def timed(fn, iters=50):
        for _ in range(10):
            fn()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in ev)

    flops = 2.0 * T * K * N * D
    ms_ours, ms_torch = timed(run_ours), timed(run_torch)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"down-projection of a top-{K} MoE: T={T} d={D} n={N} E={E}; rows per expert "
          f"min {int(counts.min())} / max {int(counts.max())}")
    print(f"  sonicmoe.grouped_gemm : {ms_ours:7.3f} ms  {flops / ms_ours / 1e9:6.1f} TFLOP/s  "
          f"rel. error vs fp32 {err:.1e}")
    print(f"  torch._grouped_mm     : {ms_torch:7.3f} ms  {flops / ms_torch / 1e9:6.1f} TFLOP/s")
    print(f"  speed-up              : {ms_torch / ms_ours:.3f}x")


def cpu_demo(reason):
    print(f"No Hopper GPU with the built kernels here ({reason}).")
    print("Running the pure-PyTorch reference MoE on a small config on the CPU instead.")
    torch.manual_seed(0)
    t, d, n, e, k = 512, 256, 128, 8, 2
    x = torch.randn(t, d)
    router = torch.randn(e, d) * d**-0.5
    w1 = torch.randn(e, 2 * n, d) * d**-0.5
    w2 = torch.randn(e, d, n) * n**-0.5
    start = time.perf_counter()
    out = sonicmoe.reference.moe(x, router, w1, w2, k, routing="topk_softmax")
    ms = (time.perf_counter() - start) * 1e3
    flops = 6.0 * t * k * d * n
    print(f"reference forward: T={t} d={d} n={n} E={e} K={k}: out {tuple(out.shape)}, "
          f"|out| = {out.norm():.3f}, {ms:.1f} ms ({flops / ms / 1e6:.2f} GFLOP/s on the CPU)")


def main():
    if not sonicmoe.extension_available():
        reason = "sonicmoe._C is not built"
    elif not torch.cuda.is_available():
        reason = "no CUDA GPU"
    elif torch.cuda.get_device_capability() != (9, 0):
        reason = f"GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}, kernels are sm_90a"
    else:
        return gpu_demo()
    cpu_demo(reason)


if __name__ == "__main__":
    main()
