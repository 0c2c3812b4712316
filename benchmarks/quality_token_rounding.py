"""Quality check of token rounding (docs/design.md §6): train a small byte-level MoE language model twice
from the same seed, once routing by plain top-K and once by token rounding, and compare the
validation losses.

Both runs use the same math through `sonicmoe.reference.moe` in fp32 (the question is the routing,
not the kernels). Top-K runs "softmax_topk", the score function token rounding rounds; token
rounding trains with routing="token_rounding" and evaluates with plain top-K, as `sonicmoe.MoE` does.
Corpus: the Python standard library's own source files (sorted, concatenated, bytes), so every
machine has it; the last 10% is the validation split.

  python benchmarks/quality_token_rounding.py --out quality-out [--steps 300] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from sonicmoe import reference  # noqa: E402


def stdlib_corpus(max_bytes: int) -> torch.Tensor:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    data = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class MoEBlock(nn.Module):
    """Pre-norm causal attention, then a pre-norm MoE (SwiGLU experts) with the given routing."""

    def __init__(self, d, heads, n, experts, top_k, routing, tile):
        super().__init__()
        self.heads, self.top_k, self.routing, self.tile = heads, top_k, routing, tile
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.router_weight = nn.Parameter(torch.randn(experts, d) * d**-0.5)
        self.w1 = nn.Parameter(torch.randn(experts, 2 * n, d) * d**-0.5)
        self.w2 = nn.Parameter(torch.randn(experts, d, n) * n**-0.5)

    def forward(self, x):
        B, S, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(B, S, d))
        # Token rounding is training-time routing; evaluation routes by plain top-K.
        routing = self.routing if self.training else "softmax_topk"
        y = reference.moe(self.norm2(x), self.router_weight, self.w1, self.w2, self.top_k, routing,
                          tile=self.tile)
        return x + y


class ByteLM(nn.Module):
    def __init__(self, args, routing):
        super().__init__()
        self.embed = nn.Embedding(256, args.d)
        nn.init.normal_(self.embed.weight, std=args.d**-0.5)  # tied output: logits of unit scale
        self.blocks = nn.ModuleList(
            MoEBlock(args.d, args.heads, args.n, args.experts, args.top_k, routing, args.tile)
            for _ in range(args.layers))
        self.norm = nn.LayerNorm(args.d)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T


def batches(data, batch, seq, generator):
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=generator)
    window = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


@torch.no_grad()
def evaluate(model, data, args, device):
    model.eval()
    gen = torch.Generator().manual_seed(1234)  # the same validation windows for both runs
    losses = []
    for _ in range(args.eval_batches):
        x, y = batches(data, args.batch, args.seq, gen)
        logits = model(x.to(device))
        losses.append(F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train(routing, train_data, val_data, args, device):
    torch.manual_seed(args.seed)
    model = ByteLM(args, routing).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    curve, val_curve = [], []
    t0 = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(1.0, step / 30) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batches(train_data, args.batch, args.seq, gen)
        loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            val_curve.append((step, evaluate(model, val_data, args, device)))
            print(f"{routing:>15} step {step:4d} train {loss.item():.4f} val {val_curve[-1][1]:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    return {"train_loss": curve, "val_loss": val_curve, "final_val_loss": val_curve[-1][1],
            "seconds": time.time() - t0}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="quality-out")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--corpus-bytes", type=int, default=8 << 20)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    data = stdlib_corpus(args.corpus_bytes)
    split = int(data.numel() * 0.9)
    train_data, val_data = data[:split], data[split:]
    tokens_per_step = args.batch * args.seq
    print(f"corpus {data.numel() / 2**20:.1f} MiB of stdlib sources; {tokens_per_step} tokens per step, "
          f"E={args.experts}, K={args.top_k}, tile={args.tile} "
          f"(about {tokens_per_step * args.top_k // args.experts} tokens per expert); device {args.device}")

    runs = {r: train(r, train_data, val_data, args, args.device) for r in ("softmax_topk", "token_rounding")}
    top_k_loss = runs["softmax_topk"]["final_val_loss"]
    tr_loss = runs["token_rounding"]["final_val_loss"]
    rel = (tr_loss - top_k_loss) / top_k_loss
    print(f"\nfinal validation loss: top-K {top_k_loss:.4f}, token rounding {tr_loss:.4f}, "
          f"relative difference {rel:+.2%} (target: within 2%)")

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality_token_rounding.json").write_text(json.dumps(
        {"args": vars(args), "device": args.device, "relative_difference": rel, "runs": runs}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, run in runs.items():
        ax.plot(run["train_loss"], alpha=0.5, label=f"{name} train")
        steps, vals = zip(*run["val_loss"])
        ax.plot(steps, vals, marker="o", label=f"{name} val ({run['final_val_loss']:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title("Byte-level MoE LM on stdlib sources: top-K vs token rounding")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "quality_token_rounding.png", dpi=120)


if __name__ == "__main__":
    main()
