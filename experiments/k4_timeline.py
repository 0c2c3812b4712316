"""K4's timeline, tile by tile, on a build with experiments/k4_timeline.diff (a diagnostic, never the
product: it writes its stamps over dH, and over K6's output). Each consumer warpgroup records,
per tile, the global timer (ns) and its SM's cycle counter before the ping-pong wait, at its
mainloop's start, when its WGMMAs are done and when its epilogue is done. This reads them back
and says, per config and part (K4 and, for reference, K6, each on the ping-pong and the
cooperative 128 x 256 tile):

  event     CUDA-event time of one K4 call (µs); span: first stamp to last
  mma, epi  per tile, median µs of the mainloop and of the epilogue (cycles at the SM clock)
  wait      ping-pong only: median µs a warpgroup waits for its turn after its epilogue
  busy      the mainloops' share of each SM's span (the tensor cores' time, at most)
  idle      ping-pong only: median µs between one mainloop's end and the next's start on an SM
  in_epi    how many tiles are in their epilogue at once, over 2000 instants: mean, p10, p90, and
            the share of instants with more than 3/4 of the grid's CTAs in one (co: lockstep if large)

    python3 experiments/k4_timeline.py [--configs a,b] [--save DIR]   # on the H200, linked build

With --save, the raw stamps (int64, one row per record: ns x 4, cycles x 4, smid << 32 | j) go to
DIR/<config>_<tile>.pt for reading off the machine.
"""
import argparse
import pathlib
import sys

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import sonicmoe  # noqa: E402
from bench import expert_inputs, load_anchors, time_ms  # noqa: E402
from sonicmoe._ops import down_proj_grad, grouped_gemm_kn  # noqa: E402

TILES = {"pp": ("varlen_pingpong_128x128x64", 128, False), "co_n256": ("varlen_cooperative_128x256x64", 256, True)}
DEFAULT = "olmoe-1b-7b,qwen3-30b-a3b,paper-30b-n512,qwen3-235b-a22b"


def records(out, offsets, tile_n, cooperative, n_out):
    """The stamps of every (tile, warpgroup half) with rows, from the output (K4: dH, whose n_out
    is n; K6: dX~): (records, 9) int64."""
    n_blocks = -(-n_out // tile_n)
    rows, cols = [], []
    off = offsets.tolist()
    for e in range(len(off) - 1):
        for start in range(off[e], off[e + 1], 128):
            halves = [0, 64] if cooperative and off[e + 1] - start > 64 else [0]
            for nb in range(n_blocks):
                for r in halves:
                    rows.append(start + r)
                    cols.append(nb * tile_n // 4)
    out64 = out.view(torch.int64)
    rows = torch.tensor(rows, device=out.device)[:, None]
    cols = torch.tensor(cols, device=out.device)[:, None] + torch.arange(9, device=out.device)
    return out64[rows, cols].cpu()


def quantiles(x, qs):
    return [float(v) for v in torch.quantile(x.double(), torch.tensor(qs, dtype=torch.float64))]


def summarize(rec, event_us, cooperative):
    # Stamps that are not ordered were not written (or were overwritten): counted, dropped.
    ordered = (rec[:, 0] > 0) & (rec[:, 1] >= rec[:, 0]) & (rec[:, 2] >= rec[:, 1]) & (rec[:, 3] >= rec[:, 2])
    bad = int((~ordered).sum())
    rec = rec[ordered]
    # One record per tile: a cooperative tile's two warpgroups run one mainloop together.
    _, first = np.unique(rec[:, 8].numpy(), return_index=True)
    rec = rec[torch.from_numpy(np.sort(first))]
    ns, cyc = rec[:, 0:4].double(), rec[:, 4:8].double()
    smid = rec[:, 8] >> 32
    ghz = float(((cyc[:, 3] - cyc[:, 0]) / (ns[:, 3] - ns[:, 0]).clamp(min=1)).median())
    dur = lambda a, b: (cyc[:, b] - cyc[:, a]) / ghz / 1e3  # µs by the SM's own counter
    t0 = ns[:, 0].min()
    span_us = float(ns[:, 3].max() - t0) / 1e3
    mma, epi, wait = dur(1, 2), dur(2, 3), dur(0, 1)
    sms = smid.unique()
    busy, idle = [], []
    for sm in sms.tolist():
        sel = smid == sm
        start, end = ns[sel, 1], ns[sel, 2]
        order = start.argsort()
        busy.append(float(mma[sel].sum()) / (float(ns[sel, 3].max() - ns[sel, 0].min()) / 1e3))
        if not cooperative and sel.sum() > 1:
            idle.append((start[order][1:] - end[order][:-1]) / 1e3)
    instants = t0 + torch.linspace(0, 1, 2000, dtype=torch.float64) * (ns[:, 3].max() - t0)
    in_epi = ((ns[None, :, 2] <= instants[:, None]) & (instants[:, None] < ns[None, :, 3])).sum(1).double()
    ctas = len(sms)
    row = dict(event=event_us, span=span_us, ghz=ghz, records=len(rec), bad=bad, ctas=ctas,
               mma=float(mma.median()), epi=float(epi.median()), wait=float(wait.median()),
               busy=sum(busy) / len(busy), in_epi=float(in_epi.mean()),
               in_epi_p10_p90=quantiles(in_epi, [0.1, 0.9]),
               in_epi_over_3_4=float((in_epi > 0.75 * ctas).double().mean()))
    if idle:
        row["idle"] = float(torch.cat(idle).median())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=DEFAULT)
    ap.add_argument("--save", default=None)
    args = ap.parse_args()
    _, _, configs = load_anchors()
    print(f"{'config':18} {'part':11} {'event':>7} {'span':>7} {'GHz':>5} {'mma':>6} {'epi':>6} {'wait':>6} "
          f"{'idle':>6} {'busy':>5} {'in_epi mean p10 p90 >3/4':>26}")
    for name in args.configs.split(","):
        cfg = configs[name]
        torch.manual_seed(0)
        x, w1, w2, off, g = expert_inputs(cfg)
        h, _ = sonicmoe.up_proj(x, w1, off, g)
        d_out = torch.randn(cfg["T"], cfg["d"], device="cuda").bfloat16()
        row_score = torch.rand(cfg["T"] * cfg["K"], device="cuda")
        parts = []
        for short, (tile_config, tile_n, cooperative) in TILES.items():
            k4 = lambda t=tile_config: down_proj_grad(d_out, w2, h, row_score, off, g, tile_config=t)[0]
            parts.append((f"K4_{short}", k4, tile_n, cooperative, cfg["n"]))
        d_h = parts[0][1]()  # K6's input: any dH of the right shape (the stamps in it do not matter)
        for short, (tile_config, tile_n, cooperative) in TILES.items():
            k6 = lambda t=tile_config: grouped_gemm_kn(d_h, w1, off, tile_config=t)
            parts.append((f"K6_{short}", k6, tile_n, cooperative, cfg["d"]))
        for short, fn, tile_n, cooperative, n_out in parts:
            event_us = time_ms(fn, warmup=5, iters=20) * 1e3
            out = fn()
            torch.cuda.synchronize()
            rec = records(out, off, tile_n, cooperative, n_out)
            if args.save:
                pathlib.Path(args.save).mkdir(parents=True, exist_ok=True)
                torch.save(rec, pathlib.Path(args.save) / f"{name}_{short}.pt")
            s = summarize(rec, event_us, cooperative)
            p10, p90 = s["in_epi_p10_p90"]
            print(f"{name:18} {short:11} {s['event']:7.0f} {s['span']:7.0f} {s['ghz']:5.2f} {s['mma']:6.1f} "
                  f"{s['epi']:6.1f} {s['wait']:6.1f} {s.get('idle', float('nan')):6.1f} {s['busy']:5.2f} "
                  f"{s['in_epi']:8.1f} {p10:5.0f} {p90:5.0f} {s['in_epi_over_3_4']:5.2f}  ({s['records']} tiles, "
                  f"{s['ctas']} CTAs, {s['bad']} bad)", flush=True)
    print("(µs; mma / epi / wait / idle per tile, medians; busy: the mainloops' share of each SM's span; "
          "in_epi: CTAs in an epilogue at once, of the grid's)")


if __name__ == "__main__":
    main()
