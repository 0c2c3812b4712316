"""SonicMoE demo: one training step of the MoE layer.

On a Hopper GPU with the built kernels: one forward + backward of sonicmoe.MoE's layer at a real
model's shape (Qwen3-30B-A3B's experts, T 32768 tokens; --config picks another) against a
torch._grouped_mm layer built the way torchtitan builds it, timed in the same process: forward,
backward, the memory each keeps for backward, and the error of both against each other. Writes
a PNG of the comparison (--png, where matplotlib is installed).

Elsewhere: says why, and runs the pure-PyTorch reference layer (sonicmoe.reference) on a small
config on the CPU, forward and backward.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import sonicmoe  # noqa: E402

CONFIGS = {  # (T, d, n, E, K)
    "qwen3-30b-a3b": (32768, 2048, 768, 128, 8),
    "olmoe-1b-7b": (32768, 2048, 1024, 64, 8),
    "paper-7b-n256": (24576, 1536, 256, 128, 8),
}


def unsupported_reason():
    if not sonicmoe.extension_available():
        return "sonicmoe._C is not built (bash scripts/setup.sh builds it)"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}; the kernels are sm_90a"
    return None


def gpu_demo(name, png):
    from bench import kept_mib, torch_grouped_mm_layer
    from sidebyside import bench as timed_ms

    T, d, n, E, K = CONFIGS[name]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, sonicmoe {sonicmoe.__version__}")
    print(f"one training step of an MoE layer at {name}: T={T} d={d} n={n} E={E} top-{K} (bf16)")
    torch.manual_seed(0)
    x = torch.randn(T, d, device="cuda").bfloat16().requires_grad_()
    router = (torch.randn(E, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16().requires_grad_()
    grad = torch.randn(T, d, device="cuda").bfloat16()
    layers = {
        # softmax over the K chosen logits, as the torch layer routes
        "sonicmoe": lambda: sonicmoe.moe(x, router, w1, w2, K, routing="topk_softmax"),
        "torch._grouped_mm": lambda: torch_grouped_mm_layer(x, router, w1, w2, K),
    }
    outputs = {label: forward().float() for label, forward in layers.items()}
    diff = float(((outputs["sonicmoe"] - outputs["torch._grouped_mm"]).norm() / outputs["torch._grouped_mm"].norm()).detach())
    del outputs
    flops = 6.0 * T * K * d * n
    rows = {}
    for label, forward in layers.items():
        def step(forward=forward):
            forward().backward(grad)
            x.grad = router.grad = w1.grad = w2.grad = None
        fwd_ms, step_ms = timed_ms(forward), timed_ms(step)
        rows[label] = {"forward ms": fwd_ms, "backward ms": step_ms - fwd_ms, "kept MiB": kept_mib(forward),
                       "fwd TFLOP/s": flops / fwd_ms / 1e9, "bwd TFLOP/s": 2 * flops / (step_ms - fwd_ms) / 1e9}
    print(f"{'layer':<20}{'forward ms':>11}{'backward ms':>12}{'fwd TFLOP/s':>12}{'bwd TFLOP/s':>12}{'kept MiB':>10}")
    for label, r in rows.items():
        print(f"{label:<20}{r['forward ms']:>11.2f}{r['backward ms']:>12.2f}{r['fwd TFLOP/s']:>12.0f}"
              f"{r['bwd TFLOP/s']:>12.0f}{r['kept MiB']:>10.0f}")
    ours, theirs = rows["sonicmoe"], rows["torch._grouped_mm"]
    print(f"speed-up: forward {theirs['forward ms'] / ours['forward ms']:.2f}x, backward "
          f"{theirs['backward ms'] / ours['backward ms']:.2f}x; memory kept {ours['kept MiB'] / theirs['kept MiB']:.2f}x; "
          f"outputs differ by {diff:.1e} (relative, bf16 rounding)")
    if png:
        write_png(rows, name, png)


def write_png(rows, name, path):
    try:
        import matplotlib
    except ImportError:
        print(f"(no PNG: matplotlib is not installed; pip install matplotlib writes {path})")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = list(rows)
    for ax, keys, title in ((axes[0], ("forward ms", "backward ms"), "time per step (ms)"),
                            (axes[1], ("kept MiB",), "memory kept for backward (MiB)")):
        for i, key in enumerate(keys):
            ax.bar([j + 0.4 * i for j in range(len(labels))], [rows[label][key] for label in labels], 0.4, label=key)
        ax.set_xticks([j + 0.2 * (len(keys) - 1) for j in range(len(labels))], labels)
        ax.set_title(title)
        if len(keys) > 1:
            ax.legend()
    fig.suptitle(f"MoE layer, one training step at {name} ({torch.cuda.get_device_name()})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def cpu_demo(reason):
    print(f"No Hopper GPU with the built kernels here: {reason}.")
    print("Running the pure-PyTorch reference layer (sonicmoe.reference) on a small config on the CPU instead.")
    torch.manual_seed(0)
    t, d, n, e, k = 512, 256, 128, 8, 2
    x = torch.randn(t, d, requires_grad=True)
    router = (torch.randn(e, d) * d**-0.5).requires_grad_()
    w1 = (torch.randn(e, 2 * n, d) * d**-0.5).requires_grad_()
    w2 = (torch.randn(e, d, n) * n**-0.5).requires_grad_()
    start = time.perf_counter()
    out = sonicmoe.reference.moe(x, router, w1, w2, k, routing="topk_softmax")
    fwd_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    out.square().mean().backward()
    bwd_ms = (time.perf_counter() - start) * 1e3
    print(f"reference layer: T={t} d={d} n={n} E={e} K={k}: out {tuple(out.shape)}, forward {fwd_ms:.1f} ms, "
          f"backward {bwd_ms:.1f} ms, |dw1| = {w1.grad.norm():.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="qwen3-30b-a3b")
    parser.add_argument("--png", default="demo.png", help="where the comparison's PNG goes ('' for none)")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason:
        return cpu_demo(reason)
    gpu_demo(args.config, args.png)


if __name__ == "__main__":
    main()
