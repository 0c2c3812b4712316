"""An A/B of the layer's backward rules in one process on one card: sonicmoe.moe's forward +
backward at one config under each variant of python/sonicmoe/functional.py's rules (or of the
autotuner's timing), timed as benchmarks/sidebyside.py times a layer (interleaved rounds in a
rotating order, each the median of 10 calls after 3; a variant's speed over the base's paired
within a round) and back to back at the card's power cap (sidebyside's ENERGY windows: time,
energy, power and SM clock a call).

  python3 benchmarks/ab_rules.py CONFIG [VARIANT ...]     env: ROUNDS=6

Variants (default: all of them; `base` always runs, and a variant that is the base's rule at
CONFIG runs the same code, so it reads the spread of two identical layers):
  base          the rules as they stand
  dw1=k7        dW1 on K7 (x gathered in its loads) at every n
  dw1=copy      dW1 by torch._grouped_mm over a copy of x in the sorted layout at every n
  copy=gather   dW1's copy of x (where the rule takes the copy path) gathered, each row of x read
                K times, not scattered from each token's rows
  tail=beside   the backward's tail on a second stream beside K5 / K7 at every n
  tail=beside16 the same, K5 / K7 leaving it 16 SMs (not 4): at the power cap the GEMMs' rate
                follows the power more than the SMs they hold
  tail=after    the tail after K5 / K7 at every n
  tune=windows  the tiles the autotuner chooses without its settle (SONICMOE_AUTOTUNE_SETTLE_MS=0,
                its own cache file; csrc/host/autotune.h): the settle's choices against these
  KERNEL=TILE   one kernel on a given tile in the layer (k1, k2, k4, k6, or k57 for both weight
                gradients; TILE one of sonicmoe.GEMM_TILE_CONFIGS that the op takes), e.g.
                k2=varlen_cooperative_128x256x64_c2x1: the autotuner's choice against another
                (named only, not in the default set)
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import statistics
import sys
import time
from unittest import mock

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import sidebyside  # noqa: E402
import sonicmoe  # noqa: E402
from sonicmoe import functional  # noqa: E402


def _beside(x, n, partial_rows):  # the rule's other conditions (eager CUDA, top-K layouts), any n
    return x.is_cuda and not partial_rows


# Each variant: the functional.py names it replaces and their replacements (a rule's with the
# rule's signature).
VARIANTS = {
    "dw1=k7": {"_dw1_on_k7": lambda n, device=None: True},
    "dw1=copy": {"_dw1_on_k7": lambda n, device=None: False},
    "copy=gather": {"_x_in_sorted_rows": lambda x, gather_idx, rev_idx: x[gather_idx.long()]},
    "tail=beside": {"_tail_beside_weight_grads": _beside},
    "tail=beside16": {"_tail_beside_weight_grads": _beside, "_TAIL_SM_MARGIN": 16},
    "tail=after": {"_tail_beside_weight_grads": lambda x, n, partial_rows: False},
}
# Variants of the environment instead (each side's tiles tuned on its warm-up call).
ENV_VARIANTS = {
    "tune=windows": {"SONICMOE_AUTOTUNE_SETTLE_MS": "0"},
}
# KERNEL=TILE variants: the functional.py name of each kernel's op.
KERNEL_OPS = {"k1": "up_proj", "k2": "grouped_gemm", "k4": "down_proj_grad", "k6": "grouped_gemm_kn",
              "k57": "weight_grad"}


def tile_swaps(variant):
    """The functional.py swap of a KERNEL=TILE variant (its op with tile_config fixed), else None."""
    kernel, _, tile = variant.partition("=")
    if kernel not in KERNEL_OPS or tile not in sonicmoe.GEMM_TILE_CONFIGS or tile == "auto":
        return None
    op = KERNEL_OPS[kernel]
    return {op: functools.partial(getattr(functional, op), tile_config=tile)}


def check_variants(names):
    unknown = [v for v in names
               if v != "base" and v not in VARIANTS and v not in ENV_VARIANTS and tile_swaps(v) is None]
    if unknown:
        raise ValueError(f"variants {unknown} are unknown; must be among base, "
                         f"{', '.join([*VARIANTS, *ENV_VARIANTS])}, or KERNEL=TILE with KERNEL among "
                         f"{', '.join(KERNEL_OPS)} and TILE a tile of sonicmoe.GEMM_TILE_CONFIGS")
    return ["base"] + [v for v in names if v != "base"]


def under(variant, fn):
    """fn with functional.py's names (or the environment) swapped for the variant's while it runs
    (the backward's autograd thread reads the module's globals during fn), restored after."""
    if variant == "base":
        return fn
    swaps = VARIANTS.get(variant) or tile_swaps(variant) or {}
    env = ENV_VARIANTS.get(variant, {})

    def call():
        with contextlib.ExitStack() as stack:
            if swaps:
                stack.enter_context(mock.patch.multiple(functional, **swaps))
            if env:
                stack.enter_context(_autotuner_env(env))
            return fn()
    return call


@contextlib.contextmanager
def _autotuner_env(env):
    """env set while inside; the autotuner's choices in memory dropped on the way in and (env
    restored) on the way out, so that each side reads its own timing's cache file."""
    try:
        with mock.patch.dict(os.environ, env):
            sonicmoe.autotune_clear()
            yield
    finally:
        sonicmoe.autotune_clear()


def main(argv):
    if not argv:
        sys.exit(__doc__)
    known = {c[0]: c for c in sidebyside.CONFIGS + sidebyside.MODELS}
    if argv[0] not in known:
        raise ValueError(f"config {argv[0]!r} is unknown; must be among {sorted(known)}")
    variants = check_variants(argv[1:] or [*VARIANTS, *ENV_VARIANTS])
    rounds = int(os.environ.get("ROUNDS", "6"))
    _, T, d, n, E, K = known[argv[0]]
    _, fwd_bwd = sidebyside.project_fns(T, d, n, E, K)
    fns = {v: under(v, fwd_bwd) for v in variants}
    first_s = {}
    for v, fn in fns.items():  # the autotuner's first calls (its tuning), and each path's allocations
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        first_s[v] = time.perf_counter() - start
    times = {v: [] for v in fns}
    for r in range(rounds):
        for v in sidebyside.rotated(list(fns), r):
            times[v].append(sidebyside.bench(fns[v]))
    medians = {v: statistics.median(t) for v, t in times.items()}
    readings = sidebyside.energy_interleaved(fns, medians)
    print(f"{torch.cuda.get_device_name()}, {argv[0]} (T {T}, d {d}, n {n}, E {E}, K {K}), fwd+bwd, "
          f"{rounds} rounds")
    print(f"{'variant':<14}{'ms':>7}  {'speed / base (range)':<24}  "
          "sustained: ms, J, W, MHz a call; speed, energy / base")
    base_ms, base_j = readings["base"][2], readings["base"][0] * readings["base"][2] / 1e3
    for v in fns:
        ratios = [b / x for b, x in zip(times["base"], times[v])]
        watts, mhz, call_ms = readings[v]
        joules = watts * call_ms / 1e3
        print(f"{v:<14}{medians[v]:7.2f}  {statistics.median(ratios):.4f} ({min(ratios):.3f}-{max(ratios):.3f})"
              f"{'':<6}  {call_ms:.2f}, {joules:.2f}, {watts:.0f}, {mhz:.0f}; "
              f"{base_ms / call_ms:.4f}, {base_j / joules:.4f}")
    print("first call, s (the autotuner's tuning of the classes it meets first): " +
          ", ".join(f"{v} {s:.1f}" for v, s in first_s.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
