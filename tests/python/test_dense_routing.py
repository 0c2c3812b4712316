"""dense_routing_metadata (token rounding's sorted layout in upper-bound buffers): checked on the
CPU by running the kernels' pipeline in PyTorch over it against reference.moe_dense_routed."""

import re

import pytest
import torch
import torch.nn.functional as F

from conftest import requires_extension
from sonicmoe import reference
from sonicmoe.routing import dense_routing_metadata, dense_row_bound, token_rounding


def pipeline_through_metadata(x, w1, w2, meta):
    """What up_proj (partial rows), grouped_gemm and combine_csr compute, in float64."""
    n = w2.shape[2]
    M = int(meta.expert_offsets[-1])
    bounds = meta.expert_offsets.tolist()
    xs = x[meta.gather_idx[:M].long()]
    y = x.new_zeros(M, x.shape[1])
    for e in range(w1.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        h = xs[lo:hi] @ w1[e].T
        y[lo:hi] = (F.silu(h[:, :n]) * h[:, n:]) @ w2[e].T
    out = x.new_zeros(x.shape)
    offs = meta.token_offsets.tolist()
    for t in range(x.shape[0]):
        for j in range(offs[t], offs[t + 1]):
            out[t] += meta.row_scores[j].double() * y[meta.rows[j]]
    return out


@pytest.mark.parametrize("T,E,K,tile,rule,skew", [
    (64, 8, 2, 8, "nearest", False),
    (100, 16, 4, 16, "up", True),
    (37, 4, 1, 8, "down", False),
    (50, 8, 8, 16, "nearest", False),
    (0, 4, 2, 8, "nearest", False),
])
def test_metadata_reproduces_the_dense_reference(T, E, K, tile, rule, skew):
    gen = torch.Generator().manual_seed(T + E)
    d, n = 16, 8
    x = torch.randn(T, d, generator=gen, dtype=torch.float64)
    w1 = torch.randn(E, 2 * n, d, generator=gen, dtype=torch.float64) * d**-0.5
    w2 = torch.randn(E, d, n, generator=gen, dtype=torch.float64) * n**-0.5
    logits = torch.randn(T, E, generator=gen, dtype=torch.float64)
    if skew:
        logits[:, 0] += 3.0
    scores, assigned = token_rounding(logits, K, tile, rule)
    bound = dense_row_bound(T, E, K, tile)
    meta = dense_routing_metadata(scores, assigned, bound)
    M = int(assigned.sum())
    assert M <= bound and int(meta.expert_offsets[-1]) == M and int(meta.token_offsets[-1]) == M
    assert meta.gather_idx.shape == meta.rows.shape == meta.row_scores.shape == (bound,)
    assert meta.sorted_scores.shape == (bound,)
    # The backward's per-row scores: each entry's score at its sorted row, zero past M.
    assert torch.equal(meta.sorted_scores[meta.rows[:M].long()], meta.row_scores[:M])
    assert not meta.sorted_scores[M:].any()
    # Rows of an expert hold its tokens in order; each token's entries list its experts in order.
    for e in range(E):
        lo, hi = int(meta.expert_offsets[e]), int(meta.expert_offsets[e + 1])
        assert meta.gather_idx[lo:hi].tolist() == assigned[:, e].nonzero().flatten().tolist()
    torch.testing.assert_close(pipeline_through_metadata(x, w1, w2, meta),
                               reference.moe_dense_routed(x, w1, w2, scores, assigned))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T,E,K,tile,rule,skew", [
    (4096, 64, 8, 128, "nearest", False), (1000, 256, 8, 16, "up", True), (3000, 1024, 4, 128, "down", False),
    (1, 8, 2, 128, "nearest", False), (0, 8, 2, 128, "nearest", False), (777, 33, 5, 64, "up", True),
    (16384, 512, 8, 128, "nearest", False), (2080, 96, 2, 32, "down", True),
])
def test_dense_layout_kernels_match_the_torch_pipeline(T, E, K, tile, rule, skew):
    # dense_layout (token_rounding.cu) against the nonzero_static pipeline, field by field.
    from sonicmoe import routing
    from sonicmoe._ops import dense_layout

    gen = torch.Generator().manual_seed(T * 31 + E)
    logits = torch.randn(T, E, generator=gen)
    if skew:
        logits[:, 0] += 3.0
    scores, assigned = token_rounding(logits, K, tile, rule)  # CPU: the reference assignment
    bound = dense_row_bound(T, E, K, tile)
    want = dense_routing_metadata(scores, assigned, bound)
    got = dense_layout(assigned.cuda().t().contiguous(), scores.float().cuda().t().contiguous(), bound)
    for name, w, g in zip(routing.DenseRoutingMetadata._fields, want, got):
        assert torch.equal(g.cpu(), w), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dense_layout_kernels_on_an_unaligned_assignment_and_a_loose_bound():
    # T % 16 == 0 but the assignment starts one byte into its storage (the byte-load path of
    # the masks), and a row_bound past the pairs (zeros to the end of every buffer).
    from sonicmoe import routing
    from sonicmoe._ops import dense_layout

    T, E, K, tile = 1024, 40, 4, 64
    gen = torch.Generator().manual_seed(5)
    scores, assigned = token_rounding(torch.randn(T, E, generator=gen), K, tile, "nearest")
    bound = dense_row_bound(T, E, K, tile) + 1000
    want = dense_routing_metadata(scores, assigned, bound)
    storage = torch.zeros(E * T + 1, dtype=torch.bool, device="cuda")
    unaligned = storage[1:].view(E, T)
    unaligned.copy_(assigned.t())
    assert unaligned.is_contiguous() and unaligned.data_ptr() % 16 == 1
    got = dense_layout(unaligned, scores.float().cuda().t().contiguous(), bound)
    for name, w, g in zip(routing.DenseRoutingMetadata._fields, want, got):
        assert torch.equal(g.cpu(), w), name


@requires_extension
@pytest.mark.parametrize("op,args,message", [
    ("token_rounding_assign", (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bool), 0, 0),
     "token_rounding_assign: tile = 0 breaks the rule: must be >= 1"),
    ("token_rounding_assign", (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bool), 128, 3),
     "token_rounding_assign: rule = 3 breaks the rule"),
    ("token_rounding_assign", (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bool), 2**31, 0),
     "token_rounding_assign: tile = 2147483648 breaks the rule: must fit in int32"),
    ("token_rounding_assign", (torch.zeros(4, 8), torch.zeros(4, 7, dtype=torch.bool), 128, 0),
     "token_rounding_assign: chosen_t.shape = [4, 7] breaks the rule: must equal probs_t.shape = [4, 8]"),
    ("token_rounding_assign", (torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.bool), 128, 0),
     "token_rounding_assign: probs_t.device = cpu breaks the rule: must be a CUDA device"),
    ("dense_layout", (torch.zeros(4, 8, dtype=torch.bool), torch.zeros(4, 8), -1),
     "dense_layout: row_bound = -1 breaks the rule"),
    ("dense_layout", (torch.zeros(2000, 8, dtype=torch.bool), torch.zeros(2000, 8), 10),
     "dense_layout: num_experts = 2000 breaks the rule: must be in [1, 1024]"),
])
def test_device_routing_ops_reject_bad_arguments(op, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(torch.ops.sonicmoe, op)(*args)
