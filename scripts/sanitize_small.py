"""One small forward + backward of sonicmoe.moe on the kernels, for compute-sanitizer (memcheck,
racecheck): top-K with an all-but-empty expert and ragged counts, then token rounding (tile 64,
upper-bound buffers), at n 384 (the top-K backward's tail on a second stream beside K5 / K7) and at
n 256 (where eager dW1 runs on K7), at n 1536 (dW1 over scatter_rows' copy), softmax_topk_norm with
the router's part of dx folded into K6; GeGLU and ReGLU once each; then K1, K2, K4, K6 (also with
its addend), K5 and K7 on the 2 x 1 clustered tile (auto takes it only at d >= 3072, and for K5 / K7
at 2048 rows per expert), on ragged routing with an odd tile count (a pair's empty half) and on
upper-bound buffers; K1, K2, K4 and K6 likewise on the ping-pong tile in 2 x 1 clusters; K2 and K6
(also with its addend) on grouped_gemm's own ping-pong 128x192 tile beside ping-pong 128x128.
scripts/gpu_check.sh runs it under both tools; on its own:

    PYTHONPATH=python compute-sanitizer --tool racecheck python3 scripts/sanitize_small.py
"""
import sys

import torch

import sonicmoe

if not (torch.cuda.is_available() and sonicmoe.extension_available()):
    sys.exit("sanitize_small.py needs a Hopper GPU and the built extension")
torch.manual_seed(0)
# softmax_topk_norm below folds the router's part of dx into K6 (grouped_gemm_kn's addend,
# router_backward_rows); softmax_topk keeps the dense router GEMM.
T, d, E, K = 300, 256, 8, 2
x = torch.randn(T, d, device="cuda").bfloat16().requires_grad_()
router = (torch.randn(E, d, device="cuda") * d**-0.5).bfloat16()
router[3] -= 4.0  # expert 3 all but empty
router.requires_grad_()
# n 384: a partial last 256-column block; n 256: the eager layer's dW1 on K7 (n <= 256); n 512: the
# top-K backward's tail on a second stream beside K5 / K7 (512 <= n <= 1024); n 1536: dW1 by
# torch._grouped_mm over scatter_rows' copy of x (1024 < n < 2048).
for n in (384, 256, 512, 1536):
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16().requires_grad_()
    for routing, options in (("softmax_topk_norm", {}), ("softmax_topk", {}), ("token_rounding", {"tile": 64})):
        out = sonicmoe.moe(x, router, w1, w2, K, routing=routing, **options)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        norms = [t.float().norm().item() for t in (out, x.grad, router.grad, w1.grad, w2.grad)]
        print(f"n {n}", routing, "out, dx, drouter, dw1, dw2 norms:", " ".join(f"{v:.4g}" for v in norms))
        for t in (x, router, w1, w2):
            t.grad = None
# GeGLU and ReGLU: K1's and K4's other two epilogues, once each at n 384.
for activation in ("geglu", "reglu"):
    n = 384
    w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16().requires_grad_()
    out = sonicmoe.moe(x, router, w1, w2, K, activation=activation)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    norms = [t.float().norm().item() for t in (out, x.grad, router.grad, w1.grad, w2.grad)]
    print(activation, "out, dx, drouter, dw1, dw2 norms:", " ".join(f"{v:.4g}" for v in norms))
    for t in (x, router):
        t.grad = None

# The clustered tile (varlen_cooperative_128x256x64_c2x1) directly: expert 3 all but empty, ragged
# counts over 8 experts; n 384 makes an odd number of 256-column blocks.
from sonicmoe._ops import device_routing_metadata, down_proj_grad, grouped_gemm_kn  # noqa: E402

C2X1 = "varlen_cooperative_128x256x64_c2x1"
n = 384
w1 = (torch.randn(E, 2 * n, d, device="cuda") * d**-0.5).bfloat16()
w2 = (torch.randn(E, d, n, device="cuda") * n**-0.5).bfloat16()
_, experts = sonicmoe.router_topk(torch.randn(T, E, device="cuda") - 4.0 * (torch.arange(E, device="cuda") == 3),
                                  K, "topk_softmax")
meta = device_routing_metadata(experts, E)
off = meta.expert_offsets


def varlen_ops(tile, partial):
    """K1, K2, K4 and K6 on one tile configuration over the ragged routing above; partial: upper-bound
    buffers, 40 rows past offsets[E] left unwritten. Returns (gather_idx, dO, [h, a, y, d_h, a', dS, dx~])."""
    g = meta.gather_idx
    if partial:
        g = torch.cat([g, torch.zeros(40, dtype=g.dtype, device="cuda")])
    h, a = sonicmoe.up_proj(x.detach(), w1, off, g, partial_rows=partial, tile_config=tile)
    y = sonicmoe.grouped_gemm(a, w2, off, tile_config=tile, partial_rows=partial)
    d_out = torch.randn(T, d, device="cuda").bfloat16()
    d_h, a_scaled, d_s = down_proj_grad(d_out, w2, h, torch.rand(g.shape[0], device="cuda"), off, g,
                                        partial_rows=partial, tile_config=tile)
    dx_rows = grouped_gemm_kn(d_h, w1, off, partial_rows=partial, tile_config=tile)
    return g, d_out, [h, a, y, d_h, a_scaled, d_s, dx_rows]


def k6_with_addend(g, d_h, partial, tiles):
    scale, rows_e = torch.randn(g.shape[0], device="cuda"), torch.randn(E, d, device="cuda").bfloat16()
    return [grouped_gemm_kn(d_h, w1, off, partial_rows=partial, tile_config=tile, addend_scale=scale,
                            addend_rows=rows_e) for tile in tiles]


def print_norms(label, partial, names, row_tensors, whole_tensors=()):
    torch.cuda.synchronize()
    rows = int(off[-1])  # ok-host: a test script
    norms = [t[:rows].float().norm().item() for t in row_tensors] + [t.float().norm().item() for t in whole_tensors]
    print(label, "partial_rows" if partial else "exact rows", names, "norms:", " ".join(f"{v:.4g}" for v in norms))


for partial in (False, True):
    g, d_out, outs = varlen_ops(C2X1, partial)
    d_h, a_scaled = outs[3], outs[4]
    # K6 with the addend on the tiles the layer above did not run (it took ping-pong)
    dx_rows_addend = k6_with_addend(g, d_h, partial,
                                    (C2X1, "varlen_cooperative_128x256x64", "varlen_cooperative_256x128x64"))
    # K5 / K7 clustered: dW2's m blocks run over d = 256 (one pair), dW1's over x's width, 256 and
    # 384 (3 m blocks: an odd count, the last pair's second tile past the output).
    dw2 = sonicmoe.weight_grad(d_out, a_scaled, off, g, True, partial_rows=partial, tile_config=C2X1)
    dw1 = sonicmoe.weight_grad(d_h, x.detach(), off, g, False, partial_rows=partial, tile_config=C2X1)
    dw1_odd = sonicmoe.weight_grad(d_h, x.detach().repeat(1, 2)[:, :384].contiguous(), off, g, False,
                                   partial_rows=partial, tile_config=C2X1)
    print_norms("c2x1", partial, "h, a, y, d_h, a', dS, dx~, dx~ + addend (c2x1, co 128x256, co 256x128), dw2, dw1, "
                "dw1 (odd)", outs + dx_rows_addend, (dw2, dw1, dw1_odd))

# The ping-pong tile in 2 x 1 clusters: K1, K2, K4, K6 (with and without the addend), the same
# ragged routing (odd tile counts leave a pair's second tile empty), exact and upper-bound rows.
PP_C2X1 = "varlen_pingpong_128x128x64_c2x1"
for partial in (False, True):
    g, _, outs = varlen_ops(PP_C2X1, partial)
    print_norms("pingpong c2x1", partial, "h, a, y, d_h, a', dS, dx~, dx~ + addend",
                outs + k6_with_addend(g, outs[3], partial, (PP_C2X1,)))

# grouped_gemm's own ping-pong 128 x 192 tile (K2 and K6 only): K2, K6 and K6 with the addend beside
# ping-pong 128 x 128 on the same operands (their norms should agree), the same ragged routing, exact
# and upper-bound rows; n_out = d = 256 leaves a 64-column last n tile.
PP, PP_N192 = "varlen_pingpong_128x128x64", "varlen_pingpong_128x192x64"
for partial in (False, True):
    g, _, outs = varlen_ops(PP, partial)
    a, d_h = outs[1], outs[3]
    ys = [sonicmoe.grouped_gemm(a, w2, off, tile_config=tile, partial_rows=partial) for tile in (PP, PP_N192)]
    dxs = [grouped_gemm_kn(d_h, w1, off, partial_rows=partial, tile_config=tile) for tile in (PP, PP_N192)]
    print_norms("pingpong 128x192", partial, "y, dx~, dx~ + addend (each pp 128x128, then pp 128x192)",
                ys + dxs + k6_with_addend(g, d_h, partial, (PP, PP_N192)))
