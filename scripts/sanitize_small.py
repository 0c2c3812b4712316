"""One small forward + backward of sonicmoe.moe on the kernels, for compute-sanitizer (memcheck,
racecheck): top-K with an all-but-empty expert and ragged counts, then token rounding (tile 64,
upper-bound buffers), at n 384 and at n 256 (where eager dW1 runs on K7). scripts/h200_check.sh
runs it under both tools; on its own:

    PYTHONPATH=python compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py
"""
import sys

import torch

import sonicmoe

if not (torch.cuda.is_available() and sonicmoe.extension_available()):
    sys.exit("sanitize_small.py needs a Hopper GPU and the built extension")
torch.manual_seed(0)
T, d, E, K = 300, 256, 8, 2
x = torch.randn(T, d, device="cuda").bfloat16().requires_grad_()
router = (torch.randn(E, d, device="cuda") * d**-0.5).bfloat16()
router[3] -= 4.0  # expert 3 all but empty
router.requires_grad_()
# n 384: a partial last 256-column block; n 256: the eager layer's dW1 on K7 (n <= 256).
for n in (384, 256):
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16().requires_grad_()
    for routing, options in (("softmax_topk_norm", {}), ("token_rounding", {"tile": 64})):
        out = sonicmoe.moe(x, router, w1, w2, K, routing=routing, **options)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        norms = [t.float().norm().item() for t in (out, x.grad, router.grad, w1.grad, w2.grad)]
        print(f"n {n}", routing, "out, dx, drouter, dw1, dw2 norms:", " ".join(f"{v:.4g}" for v in norms))
        for t in (x, router, w1, w2):
            t.grad = None
