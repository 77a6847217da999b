"""A tensor-parallel rank reads only its shard of each checkpoint tensor from safetensors."""
from __future__ import annotations

import torch
from safetensors import safe_open

from radixserve.distributed import set_tp_info
from radixserve.layers import lazy_weight
from radixserve.models.loader import load_model
from radixserve.testing import write_tiny_checkpoint


def test_rank_reads_about_half_of_a_sharded_checkpoint(tmp_path, monkeypatch) -> None:
    path = write_tiny_checkpoint("qwen3", tmp_path / "ckpt")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        total = sum(torch.Size(f.get_slice(n).get_shape()).numel() for n in f.keys())  # noqa: SIM118 -- safe_open is not a dict
    read: list[int] = []
    real_load = lazy_weight.LazyWeight.load
    monkeypatch.setattr(lazy_weight.LazyWeight, "load", lambda self: read.append(self.shape.numel()) or real_load(self))
    set_tp_info(1, 2)
    try:
        model, _ = load_model(path, torch.float32, "cpu")
    finally:
        set_tp_info(0, 1)
    assert sum(read) < 0.6 * total  # everything but norms (and replicated KV heads) is split in two
    full, _ = load_model(path, torch.float32, "cpu")
    # rank 1's slice of a column-parallel weight is the second half of the full one
    got = model.model.layers[0].mlp.gate_up_proj.weight
    want = full.model.layers[0].mlp.gate_up_proj.weight
    inter = want.shape[0] // 2
    assert torch.equal(got[: inter // 2], want[inter // 2 : inter])
