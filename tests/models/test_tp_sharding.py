"""Each layer, built as rank r of a TP group, keeps exactly its slice of the full weight. The
collectives stay the identity here: only the shards are checked, not numerics across ranks."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from radixserve.layers import (
    ColumnParallelLinear,
    FusedMoE,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from radixserve.models.loader import load_model

g = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def test_column_parallel_takes_its_output_rows(tp_rank):
    tp_rank(1, 2)
    w, b = rand(6, 8), rand(6)
    layer = ColumnParallelLinear(8, 6, bias=True)
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, b)
    assert torch.equal(layer.weight, w[3:6]) and torch.equal(layer.bias, b[3:6])


def test_row_parallel_takes_its_input_columns_and_whole_bias(tp_rank):
    tp_rank(1, 2)
    w, b = rand(6, 8), rand(6)
    layer = RowParallelLinear(8, 6, bias=True)
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, b)
    assert torch.equal(layer.weight, w[:, 4:8]) and torch.equal(layer.bias, b)


def test_merged_gate_up_concatenates_each_projections_slice(tp_rank):
    tp_rank(1, 2)
    gate, up = rand(6, 4), rand(6, 4)
    layer = MergedColumnParallelLinear(4, [6, 6])
    layer.weight_loader(layer.weight, gate, 0)
    layer.weight_loader(layer.weight, up, 1)
    assert torch.equal(layer.weight, torch.cat([gate[3:6], up[3:6]]))


def _load_qkv(layer: QKVParallelLinear, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for shard_id, full in (("q", q), ("k", k), ("v", v)):
        layer.weight_loader(layer.weight, full, shard_id)


def test_qkv_splits_query_and_kv_heads(tp_rank):
    tp_rank(1, 2)  # 4 query heads, 2 KV heads, head_dim 2: rank 1 holds q heads 2-3 and KV head 1
    q, k, v = rand(8, 5), rand(4, 5), rand(4, 5)
    layer = QKVParallelLinear(5, 2, 4, 2, bias=False)
    _load_qkv(layer, q, k, v)
    assert (layer.num_heads, layer.num_kv_heads) == (2, 1)
    assert torch.equal(layer.weight, torch.cat([q[4:8], k[2:4], v[2:4]]))


@pytest.mark.parametrize("rank,kv_head", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_qkv_replicates_kv_heads_when_fewer_than_ranks(tp_rank, rank, kv_head):
    tp_rank(rank, 4)
    q, k, v = rand(8, 5), rand(4, 5), rand(4, 5)
    layer = QKVParallelLinear(5, 2, 4, 2, bias=False)
    _load_qkv(layer, q, k, v)
    kv = slice(2 * kv_head, 2 * kv_head + 2)
    assert torch.equal(layer.weight, torch.cat([q[2 * rank : 2 * rank + 2], k[kv], v[kv]]))


def test_vocab_shard_is_padded_and_masks_other_ranks_tokens(tp_rank):
    tp_rank(1, 2)  # vocab 7 -> 4 rows per rank; rank 1 holds ids 4..6 plus a zero row
    full = rand(7, 3)
    emb = VocabParallelEmbedding(7, 3)
    emb.weight_loader(emb.weight, full)
    assert torch.equal(emb.weight[:3], full[4:7]) and not emb.weight[3].any()
    out = emb(torch.tensor([5, 2, 6]))
    assert torch.equal(out[0], full[5]) and torch.equal(out[2], full[6]) and not out[1].any()


def test_experts_are_split_on_the_intermediate_dim(tp_rank):
    tp_rank(1, 2)
    moe = FusedMoE(num_experts=3, hidden=4, intermediate=8)
    gate, up, down = rand(3, 8, 4), rand(3, 8, 4), rand(3, 4, 8)
    for e in range(3):
        moe.weight_loader(moe.w13, gate[e], (e, 0))
        moe.weight_loader(moe.w13, up[e], (e, 1))
        moe.weight_loader(moe.w2, down[e], (e, 2))
    assert torch.equal(moe.w13, torch.cat([gate[:, 4:], up[:, 4:]], dim=1))
    assert torch.equal(moe.w2, down[:, :, 4:])


def test_indivisible_sizes_name_the_field(tp_rank):
    tp_rank(0, 2)
    with pytest.raises(ValueError, match="out_features=5"):
        ColumnParallelLinear(8, 5)
    with pytest.raises(ValueError, match="num_attention_heads=3"):
        QKVParallelLinear(8, 2, 3, 1, bias=False)


def test_whole_model_loads_rank_one_of_two(tiny, tp_rank):
    tp_rank(1, 2)
    model, _ = load_model(tiny["qwen3_moe"], torch.float32, "cpu")
    with safe_open(tiny["qwen3_moe"] / "model.safetensors", "pt") as f:
        q, k, v = (f.get_tensor(f"model.layers.0.self_attn.{n}_proj.weight") for n in "qkv")
        down = f.get_tensor("model.layers.1.mlp.down_proj.weight")
        up = f.get_tensor("model.layers.2.mlp.experts.7.up_proj.weight")
    layers = model.model.layers
    assert torch.equal(
        layers[0].self_attn.qkv_proj.weight, torch.cat([q[32:64], k[16:32], v[16:32]])
    )
    assert torch.equal(layers[1].mlp.down_proj.weight, down[:, 64:128])
    assert torch.equal(layers[2].mlp.experts.w13[7, 16:32], up[16:32])
    assert layers[0].self_attn.attn.num_heads == 2 and layers[0].self_attn.attn.num_kv_heads == 1
