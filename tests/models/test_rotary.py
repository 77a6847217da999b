"""RoPE settings are read from transformers 5's `rope_parameters` or the older `rope_theta` /
`rope_scaling`, and the frequencies come from transformers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixserve.layers.rotary import RotaryEmbedding, compute_inv_freq, rope_parameters


def _expected_default(theta: float, dim: int) -> torch.Tensor:
    return torch.tensor([theta ** (-i / dim) for i in range(0, dim, 2)], dtype=torch.float32)


def test_legacy_fields_give_default_rope():
    cfg = SimpleNamespace(rope_theta=500000.0, rope_scaling=None)
    assert rope_parameters(cfg) == {"rope_theta": 500000.0, "rope_type": "default"}
    inv_freq, scaling = compute_inv_freq(cfg, 16)
    torch.testing.assert_close(inv_freq, _expected_default(500000.0, 16))
    assert scaling == 1.0


def test_legacy_scaling_type_key_is_understood():
    cfg = SimpleNamespace(rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0})
    assert rope_parameters(cfg)["rope_type"] == "linear"


def test_llama3_frequencies_come_from_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    )
    ours, _ = compute_inv_freq(cfg, 16)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    assert torch.equal(ours, theirs.float())
    assert not torch.allclose(ours, _expected_default(500000.0, 16))  # the scaling did something


def test_dynamic_rope_is_refused():
    with pytest.raises(ValueError, match="dynamic"):
        compute_inv_freq(
            SimpleNamespace(rope_theta=1e4, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
            16,
        )


def test_rotation_preserves_norm_and_is_identity_at_position_zero():
    rope = RotaryEmbedding(
        SimpleNamespace(rope_theta=1e4, rope_scaling=None), head_dim=8, max_positions=32
    )
    q, k = torch.randn(3, 16), torch.randn(3, 8)
    rq, rk = rope(torch.tensor([0, 5, 31]), q, k)
    assert torch.equal(rq[0], q[0]) and torch.equal(rk[0], k[0])
    torch.testing.assert_close(rq.view(3, 2, 8).norm(dim=-1), q.view(3, 2, 8).norm(dim=-1))
    assert not torch.allclose(rq[1], q[1])
