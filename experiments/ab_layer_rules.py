"""In-process A/B of the layer's kernel choices made in Python or per call (no rebuild): the
layer's step (gradients unset, forward, backward) under each variant, interleaved with the others
and with the forward alone, as bench.py's moe_backward times it (backward = step - forward); or
with --measure forward, the training forward under each variant.

Variants (each a set of overrides of sonicmoe.functional while its step runs):
  base       the tree's rules (dW2 on K5 at every n, dW1 on K7 except at 1024 < n < 2048:
             session 33; before it the gathered copies at n >= 2048, for dW1 at n > 1024);
  k5k7_all   dW1 on K7 at every n too (no gathered copy in eager mode);
  k57_rows_rule  K5 / K7 clustered only where experts average 2048 rows (before session 34, which
             also clusters them where an expert's output has >= 2^23 elements: deepseek-v3);
  k4_c2x1    K4 on the clustered wide tile (config 10) wherever n % 256 == 0;
  k4_rule_s13  K4 on ping-pong 128 x 128 at d < 4096 (session 13's rule; the tree's takes the
             clustered wide tile from d 2048);
  k4_pp      K4 on ping-pong 128 x 128 at every shape (for a build whose ping-pong K4 changed);
  k6_c2x1    K6 on the clustered wide tile wherever d % 256 == 0;
  k2_co, k2_c2x1  (forward) K2 on the varlen wide tile, unclustered / clustered, where d % 256 == 0;
  k1_co, k1_c2x1  (forward) K1 on the wide tile unclustered / clustered wherever n % 128 == 0;
  router_apart  the router GEMM, R and the expert MLPs as separate autograd nodes (before session
             15's _MoELayer: autograd adds the router's part of dx in a pass of its own);
  k8_addmm   the layer's backward after K4-K7 as before session 35: R's backward by torch's ops
             (~14 launches), K3's combine with unit scores, then the router's part of dx by
             cuBLAS's addmm onto its output (the tree: router_backward in one kernel, K8 starting
             its sum from that part);
  r_torch    only R's backward as before session 35 (torch's ops), K8 as in the tree.
With --measure forward the table is the training forward's TFLOP/s under each variant (H kept).
Session 14's call 3 also ran K4 on the ping-pong 64 x 256 tile of experiments/pingpong_64x256.diff
here (config 11 where n % 256 == 0 and d < 4096; measured and dropped, docs/perf-notes.md).
Also prints the SM clock and power after each config's timing (NVML through torch.cuda).

    python experiments/ab_layer_rules.py [--variants base,k5k7_all] [--configs olmoe-1b-7b,...]
    python experiments/ab_layer_rules.py --measure forward --variants base,k2_co,k2_c2x1 --configs qwen3-235b-a22b

With --protocol anchor every figure is taken as the anchors' upstream figures were (bench.py's
ANCHOR_PROTOCOL: a do_bench window after 0.5 s idle), the variants in rotating order each round;
--data anchor runs on upstream's benchmark's values.
"""
import argparse
import contextlib
import functools
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import sonicmoe  # noqa: E402
import sonicmoe.functional as F  # noqa: E402
from sonicmoe import _ops  # noqa: E402
from bench import (anchor_protocol_interleaved, layer_params, load_anchors, time_interleaved,  # noqa: E402
                   upstream_anchor, warm_up_gpu)

WIDE_C2X1 = "varlen_cooperative_128x256x64_c2x1"


def _with_tile(op, tile, fits):
    """op with tile_config = tile where fits(*args) and the caller left it on auto."""
    def run(*args, **kwargs):
        if fits(*args) and kwargs.get("tile_config", "auto") == "auto":
            kwargs["tile_config"] = tile
        return op(*args, **kwargs)
    return run


def _k2_fits(a, w2, *_):
    return w2.shape[1] % 256 == 0


def _k1_fits(x, w1, *_):
    return w1.shape[1] % 256 == 0  # 2n: n % 128 == 0


def _k4_n_fits(d_out, w2, *_):
    return w2.shape[2] % 256 == 0


def _k4_below_4096(d_out, w2, *_):
    return w2.shape[1] < 4096


def _k6_fits(d_h, w1, *_):
    return w1.shape[2] % 256 == 0


class _RouterTopK(torch.autograd.Function):
    """R alone with autograd, as the layer ran it before _MoELayer (session 15): top-K and fp32
    scores by the kernel; backward the scores' gradient to the logits."""

    @staticmethod
    def forward(ctx, logits, top_k, routing):
        scores, experts = _ops.router_topk(logits, top_k, routing)
        ctx.mark_non_differentiable(experts)
        ctx.save_for_backward(logits if routing == "softmax_topk" else None, scores, experts)
        ctx.routing, ctx.num_experts, ctx.logits_dtype = routing, logits.shape[-1], logits.dtype
        return scores, experts

    @staticmethod
    def backward(ctx, grad_scores, _grad_experts):
        logits, scores, experts = ctx.saved_tensors
        grad = F.router_scores_backward(logits, scores, experts, grad_scores, ctx.routing,
                                        num_experts=ctx.num_experts)
        return grad.to(ctx.logits_dtype), None, None


def _weight_grad_tile_by_rows(gather_a, rows, num_experts, out_elements):
    """K5 / K7's tile before session 34: clustered only where experts average 2048 rows."""
    if rows >= 2048 * num_experts:
        return WIDE_C2X1
    return "varlen_cooperative_128x256x64" if gather_a else "varlen_cooperative_256x128x64"


class _LayerApart:
    """The top-K layer as separate autograd nodes (router GEMM, R, moe_routed): autograd sums the
    two parts of dx in a pass of its own."""

    @staticmethod
    def apply(x, router_weight, w1, w2, top_k, routing, keep_h):
        scores, experts = _RouterTopK.apply(torch.nn.functional.linear(x, router_weight), top_k, routing)
        return F.moe_routed(x, w1, w2, scores, experts)


def _router_backward_by_torch(d_score_partial, rev_idx, scores, experts, logits, num_experts, routing):
    """R's backward as before session 35: torch's ops from the summed score slots."""
    return F.router_scores_backward(logits, scores, experts, F._scores_grad(d_score_partial, rev_idx), routing,
                                    num_experts=num_experts).bfloat16()


class _LayerK8Addmm(F._MoELayer):
    """_MoELayer's backward as before session 35: R's backward by torch's ops, K3's combine with
    unit scores, then the router's part of dx by cuBLAS onto its output (addmm with beta = 1: dx
    read and written once more)."""

    @staticmethod
    def backward(ctx, grad_out):
        x, router_weight, w1, w2, logits, scores, experts, h, offsets, gather_idx, rev_idx = ctx.saved_tensors
        need_x, need_router, need_w1, need_w2 = ctx.needs_input_grad[:4]
        dw1, dw2, (dx_rows, d_score_partial) = F._routed_backward(
            (need_x, need_w1, need_w2, need_x or need_router), grad_out, x, w1, w2, scores, h, offsets, gather_idx,
            rev_idx, lambda dx_rows, d_score_partial: (dx_rows, d_score_partial))
        d_logits = F.router_scores_backward(logits, scores, experts, F._scores_grad(d_score_partial, rev_idx),
                                            ctx.routing, num_experts=router_weight.shape[0]).to(x.dtype)
        d_router = d_logits.t() @ x if need_router else None
        dx = _ops.combine(dx_rows, torch.ones_like(scores), rev_idx).addmm_(d_logits, router_weight) if need_x else None
        return dx, d_router, dw1, dw2, None, None, None


OVERRIDES = {
    "base": {},
    "k5k7_all": {"_dw1_on_k7": lambda n: True},
    "k57_rows_rule": {"_weight_grad_tile": _weight_grad_tile_by_rows},
    "k4_c2x1": {"down_proj_grad": _with_tile(_ops.down_proj_grad, WIDE_C2X1, _k4_n_fits)},
    "k4_rule_s13": {"down_proj_grad": _with_tile(_ops.down_proj_grad, "varlen_pingpong_128x128x64", _k4_below_4096)},
    "k4_pp": {"down_proj_grad": _with_tile(_ops.down_proj_grad, "varlen_pingpong_128x128x64", lambda *a, **k: True)},
    "k6_c2x1": {"grouped_gemm_kn": _with_tile(_ops.grouped_gemm_kn, WIDE_C2X1, _k6_fits)},
    "k2_co": {"grouped_gemm": _with_tile(_ops.grouped_gemm, "varlen_cooperative_128x256x64", _k2_fits)},
    "k2_c2x1": {"grouped_gemm": _with_tile(_ops.grouped_gemm, WIDE_C2X1, _k2_fits)},
    "k1_co": {"up_proj": _with_tile(_ops.up_proj, "varlen_cooperative_128x256x64", _k1_fits)},
    "k1_c2x1": {"up_proj": _with_tile(_ops.up_proj, WIDE_C2X1, _k1_fits)},
    "router_apart": {"_MoELayer": _LayerApart},
    "k8_addmm": {"_MoELayer": _LayerK8Addmm},
    "r_torch": {"router_backward": _router_backward_by_torch},
}


@contextlib.contextmanager
def overridden(name):
    saved = {k: getattr(F, k) for k in OVERRIDES[name]}
    for k, v in OVERRIDES[name].items():
        setattr(F, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(F, k, v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="base,k5k7_all,k4_c2x1,k6_c2x1")
    parser.add_argument("--configs", default="olmoe-1b-7b,qwen3-30b-a3b,paper-30b-n512,paper-120b-n1024,"
                                             "qwen3-235b-a22b,paper-7b-n1024,paper-7b-n256,deepseek-v3")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--measure", choices=("backward", "forward"), default="backward")
    parser.add_argument("--protocol", choices=("sustained", "anchor"), default="sustained")
    parser.add_argument("--data", choices=("bench", "anchor"), default="bench")
    args = parser.parse_args()
    _, data, configs = load_anchors()
    variants = args.variants.split(",")
    warm_up_gpu()
    print(f"{'config':<18}" + "".join(f"{v:>11}" for v in variants) +
          f"   ({args.measure} TFLOP/s; up*)   clock MHz  W")
    for name in args.configs.split(","):
        c = configs[name]
        T, d, n, E, K = c["T"], c["d"], c["n"], c["E"], c["K"]
        x, router, w1, w2 = layer_params(T, d, n, E, data=args.data)
        grad = torch.randn(T, d, device="cuda").bfloat16()
        params = (x, router, w1, w2)

        def step(variant):
            with overridden(variant):
                for t in params:
                    t.grad = None
                sonicmoe.moe(x, router, w1, w2, K).backward(grad)

        def forward(variant):
            with overridden(variant):
                return sonicmoe.moe(x, router, w1, w2, K)

        fns = {"fwd": lambda: sonicmoe.moe(x, router, w1, w2, K)} if args.measure == "backward" else {}
        timed = step if args.measure == "backward" else forward
        fns.update({v: functools.partial(timed, v) for v in variants})
        if args.protocol == "anchor":
            ms = anchor_protocol_interleaved(fns, args.rounds)
        else:
            ms = time_interleaved(fns, rounds=args.rounds, iters=5)
        try:  # NVML (pynvml) may be missing
            clock, watts = torch.cuda.clock_rate(), f"{torch.cuda.power_draw() / 1e3:.0f}"
        except Exception as e:  # noqa: BLE001
            clock, watts = "-", type(e).__name__
        if args.measure == "backward":
            tf = {v: 12.0 * T * K * d * n / (ms[v] - ms["fwd"]) / 1e9 for v in variants}
        else:
            tf = {v: 6.0 * T * K * d * n / ms[v] / 1e9 for v in variants}
        up = upstream_anchor(data["rows"], name).get("bwd_tflops" if args.measure == "backward" else "fwd_tflops")
        print(f"{name:<18}" + "".join(f"{tf[v]:>11.1f}" for v in variants) + f"   ({up})   {clock}  {watts}",
              flush=True)
        del x, router, w1, w2, grad, params, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
