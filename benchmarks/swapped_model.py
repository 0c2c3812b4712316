"""A Hugging Face MoE model's training step with its sparse-MoE blocks swapped for SonicMoE's,
against the same model unswapped (transformers' default experts path, torch._grouped_mm).

    python benchmarks/swapped_model.py [--family qwen3_moe] [--layers 2] [--batch 4] [--seq 4096]

The model is built from transformers' own config class at the named model's block shape
(FAMILIES below: hidden size, expert width, experts, top-K, attention heads), `--layers` decoder
layers, random bf16 weights, a small vocabulary (`--vocab`, so that the LM head does not hide the
blocks), SDPA attention. Two copies share nothing: one keeps transformers' blocks, the other has
them swapped by replace_moe_blocks. A step is the forward with labels (cross-entropy loss) and
the backward; the two models take turns over --rounds rounds of --iters steps, and each one's
median step time and peak memory are printed as a table and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

# Block shapes of released models: (config class, its keyword arguments).
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(  # Qwen3-30B-A3B
        hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    "olmoe": ("OlmoeConfig", dict(  # OLMoE-1B-7B
        hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
        num_attention_heads=16, num_key_value_heads=16)),
    "mixtral": ("MixtralConfig", dict(  # Mixtral-8x7B
        hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
}


def build_model(family, layers, vocab, seed):
    import transformers

    cls_name, kwargs = FAMILIES[family]
    config = getattr(transformers, cls_name)(num_hidden_layers=layers, vocab_size=vocab,
                                             max_position_embeddings=8192, **kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.train()


def step_fn(model, ids):
    def step():
        for p in model.parameters():
            p.grad = None
        model(input_ids=ids, labels=ids).loss.backward()
    return step


def time_steps(step, iters):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_moe")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("swapped_model.py times the kernels: it needs a Hopper GPU")
    from sonicmoe.integrations.transformers import replace_moe_blocks

    reference = build_model(args.family, args.layers, args.vocab, seed=0)
    swapped = copy.deepcopy(reference)
    report = replace_moe_blocks(swapped)
    print(report)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    steps = {"transformers": step_fn(reference, ids), "sonicmoe": step_fn(swapped, ids)}
    with torch.no_grad():  # the two models compute the same loss before any timing
        losses = {k: m(input_ids=ids, labels=ids).loss.item() for k, m in (("transformers", reference), ("sonicmoe", swapped))}
    for step in steps.values():
        step()
        step()
    ms = {k: [] for k in steps}
    peak = {}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms[name].append(time_steps(steps[name], args.iters))
            peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
    tokens = args.batch * args.seq
    rows = {k: dict(ms=statistics.median(v), tokens_per_s=tokens / statistics.median(v) * 1e3,
                    peak_GiB=peak[k] / 2**30, loss=losses[k], rounds_ms=v) for k, v in ms.items()}
    speedup = rows["transformers"]["ms"] / rows["sonicmoe"]["ms"]
    print(f"{torch.cuda.get_device_name()}  {args.family}  {args.layers} layers  {args.batch}x{args.seq} tokens  vocab {args.vocab}")
    print(f"{'model':<14}{'step ms':>10}{'tokens/s':>12}{'peak GiB':>10}{'loss':>9}")
    for k, r in rows.items():
        print(f"{k:<14}{r['ms']:>10.2f}{r['tokens_per_s']:>12.0f}{r['peak_GiB']:>10.2f}{r['loss']:>9.4f}")
    print(f"speedup of the swapped model's training step: {speedup:.3f}x")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(dict(args=vars(args), device=torch.cuda.get_device_name(),
                                                          rows=rows, speedup=speedup, swapped=str(report)), indent=1))


if __name__ == "__main__":
    main()
