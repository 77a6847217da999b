"""The torch fused-MoE backend and router against a token-by-token reference written here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.layers.moe import MOE_BACKENDS, select_experts


def _reference(x, w13, w2, weights, ids):
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = w13[e, :inter] @ x[t], w13[e, inter:] @ x[t]
            out[t] += weights[t, j] * (w2[e] @ (F.silu(gate) * up))
    return out


def test_torch_backend_matches_token_by_token_reference():
    g = torch.Generator().manual_seed(0)
    x, w13, w2 = (
        torch.randn(13, 16, generator=g),
        torch.randn(6, 2 * 8, 16, generator=g),
        torch.randn(6, 16, 8, generator=g),
    )
    ids = torch.randint(0, 5, (13, 2), generator=g)  # expert 5 never chosen: empty groups are fine
    ids[:, 1] = (ids[:, 0] + 1) % 5
    weights = torch.rand(13, 2, generator=g)
    got = MOE_BACKENDS.get("torch")(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, _reference(x, w13, w2, weights, ids), atol=1e-4, rtol=1e-4)


def test_router_picks_top_k_and_normalises_when_asked():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, ids = select_experts(logits, 2, norm_topk_prob=True)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(w.sum(-1), torch.ones(1))
    raw, _ = select_experts(logits, 2, norm_topk_prob=False)
    torch.testing.assert_close(raw, torch.softmax(logits, -1)[:, [1, 2]])
