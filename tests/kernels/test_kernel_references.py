"""The pure-torch references agree with transformers' own modules and with dense attention, so
the Triton kernels are checked against something trustworthy."""
from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn.functional as F
from tests.kernels.kernel_cases import paged_table
from transformers import LlamaConfig, Qwen3MoeConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from radixserve_kernels import (
    apply_rotary_ref,
    build_cos_sin_cache,
    decode_attention_ref,
    extend_attention_ref,
    fused_add_rms_norm_ref,
    fused_moe_ref,
    rms_norm_ref,
    topk_softmax_ref,
)


def test_package_imports_without_triton() -> None:
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import radixserve_kernels as k, torch\n"
        "x = torch.randn(3, 8); print(k.rms_norm_ref(x, torch.ones(8), 1e-6).shape)\n"
        "assert not k.triton_usable(x)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "torch.Size([3, 8])" in out.stdout


def test_rms_norm_ref_matches_transformers_bf16_bitwise() -> None:
    norm = Qwen3RMSNorm(64, eps=1e-6)
    norm.weight.data = torch.randn(64)
    norm = norm.to(torch.bfloat16)
    x = torch.randn(5, 64).to(torch.bfloat16)
    res = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(rms_norm_ref(x, norm.weight, 1e-6), norm(x))
    out, new_res = fused_add_rms_norm_ref(x, res, norm.weight, 1e-6)
    assert torch.equal(new_res, x + res)
    assert torch.equal(out, norm(x + res))


def _hf_rotary(rope_parameters: dict) -> LlamaRotaryEmbedding:
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=8192,
                      rope_parameters=rope_parameters)
    return LlamaRotaryEmbedding(cfg)


def test_rotary_ref_matches_transformers_default_and_llama3() -> None:
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 1024}
    for params in ({"rope_type": "default", "rope_theta": 10000.0}, llama3):
        rope = _hf_rotary(params)
        pos = torch.tensor([0, 1, 17, 900, 5000])
        q = torch.randn(1, 4, 5, 64).to(torch.bfloat16)
        k = torch.randn(1, 2, 5, 64).to(torch.bfloat16)
        cos, sin = rope(q, pos[None])
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        cache = build_cos_sin_cache(rope.inv_freq, 8192, rope.attention_scaling)
        got_q, got_k = apply_rotary_ref(q[0].transpose(0, 1), k[0].transpose(0, 1), pos, cache)
        assert torch.equal(got_q, want_q[0].transpose(0, 1))
        assert torch.equal(got_k, want_k[0].transpose(0, 1))
    # llama3 scaling changes the low frequencies, so the second case exercised something new
    plain = _hf_rotary({"rope_type": "default", "rope_theta": 500000.0})
    assert not torch.allclose(_hf_rotary(llama3).inv_freq, plain.inv_freq)


def test_moe_refs_match_transformers_qwen3_moe_block() -> None:
    torch.manual_seed(0)
    for norm in (True, False):
        cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=6,
                             num_experts_per_tok=2, norm_topk_prob=norm)
        block = Qwen3MoeSparseMoeBlock(cfg)
        for p in block.parameters():
            p.data = torch.randn_like(p) * 0.2
        x = torch.randn(1, 11, 32)
        want = block(x)
        want = want[0] if isinstance(want, tuple) else want
        logits = F.linear(x[0], block.gate.weight)
        weights, ids = topk_softmax_ref(logits, 2, norm)
        got = fused_moe_ref(x[0], block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
        torch.testing.assert_close(got, want[0], rtol=1e-5, atol=1e-5)


def _dense_causal(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """q [e, Hq, D], k/v [n, Hkv, D]: query i sees keys 0..prefix+i (GQA by repeating heads)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= prefix + torch.arange(q.shape[0])[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_attention_refs_match_dense_causal_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    seq, ext, page = [5, 33, 16], [5, 7, 1], 4
    table, rows = paged_table(seq, page, 32, 40, gen)
    kc, vc = torch.randn(33 * page, 2, 8, generator=gen), torch.randn(33 * page, 2, 8, generator=gen)
    q = torch.randn(sum(ext), 4, 8, generator=gen)
    out = extend_attention_ref(q, kc, vc, table, rows, torch.tensor(seq), torch.tensor(ext), 0.3)
    start = 0
    for i, (n, e) in enumerate(zip(seq, ext)):
        slots = table[rows[i], :n].long()
        want = _dense_causal(q[start:start + e], kc[slots], vc[slots], n - e, 0.3)
        torch.testing.assert_close(out[start:start + e], want)
        start += e
    dq = torch.randn(3, 4, 8, generator=gen)
    dec = decode_attention_ref(dq, kc, vc, table, rows, torch.tensor(seq), 0.3)
    for i, n in enumerate(seq):
        slots = table[rows[i], :n].long()
        torch.testing.assert_close(dec[i], _dense_causal(dq[i:i + 1], kc[slots], vc[slots], n - 1, 0.3)[0])
