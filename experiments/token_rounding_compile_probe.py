"""Does token rounding's expert MLP Function still go wrong when torch.compile traces it on the
H200? sonicmoe.moe keeps it out of graphs (functional._DENSE_EAGER_REASON: traced, its backward
gave wrong dx, rel 0.73, on 2026-11-29, when the sorted layout was built by torch ops inside the
graph). Since then the layout comes from the dense_layout op, and on the CPU emulation of the ops
(tests/python/test_layer_emulated.py) the traced graphs match eager with either layout. This
traces the Function directly (bypassing the disable) on the kernels, at a few shapes, with the
kernel-built layout and with the torch-built one, and prints compiled-vs-eager relative errors of
the output and every gradient. All <= 1e-2 with the dense_layout op: the disable can go (and
test_moe.py's compile test with it).

    python3 experiments/token_rounding_compile_probe.py [--backend inductor]
"""
import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import sonicmoe  # noqa: E402
from sonicmoe import functional  # noqa: E402
from sonicmoe.routing import dense_routing_metadata_by_torch, token_rounding_expert_major  # noqa: E402

SHAPES = [(512, 256, 128, 16, 2, 64), (300, 256, 384, 8, 2, 32)]  # T, d, n, E, K, tile


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and sonicmoe.extension_available()):
        sys.exit("needs the H200 and the built extension")
    by_kernel = functional.dense_routing_metadata_expert_major
    print(f"{'T,d,n,E,K,tile':<28}{'layout':<10}" + "".join(f"{k:>10}" for k in ("out", "dx", "drouter", "dw1", "dw2")))
    for T, d, n, E, K, tile in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(T + d + n + E)
        leaves = [(torch.randn(*s, device="cuda", generator=gen) * scale).bfloat16().requires_grad_(True)
                  for s, scale in (((T, d), 1.0), ((E, d), d**-0.5), ((E, 2 * n, d), d**-0.5), ((E, d, n), n**-0.5))]
        g = torch.randn(T, d, device="cuda", generator=gen).bfloat16()

        def dense(x, w1, w2, probs, probs_t, assigned_t):
            return functional._MoEDenseExperts.apply(x, w1, w2, probs, probs_t, assigned_t, K, tile, True)

        def layer(experts, x, router, w1, w2):
            # The routing eager, outside the graph: a compiled softmax may differ in the last bit and
            # move a near-tied token at a rounding boundary (another valid assignment, not an error).
            probs, probs_t, assigned_t = token_rounding_expert_major(F.linear(x, router), K, tile, "nearest",
                                                                     fp32_probs=True)
            return experts(x, w1, w2, probs, probs_t, assigned_t)

        for name, layout in (("kernel", by_kernel), ("torch", dense_routing_metadata_by_torch)):
            functional.dense_routing_metadata_expert_major = layout
            results = []
            try:
                for experts in (dense, torch.compile(dense, fullgraph=True, backend=args.backend)):
                    for t in leaves:
                        t.grad = None
                    out = layer(experts, *leaves)
                    out.backward(g)
                    torch.cuda.synchronize()
                    results.append([out.detach()] + [t.grad.clone() for t in leaves])
            finally:
                functional.dense_routing_metadata_expert_major = by_kernel
                torch._dynamo.reset()
            errors = [rel(c, e) for e, c in zip(*results)]
            print(f"{f'{T},{d},{n},{E},{K},{tile}':<28}{name:<10}" + "".join(f"{v:>10.2e}" for v in errors))


if __name__ == "__main__":
    main()
