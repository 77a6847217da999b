"""The model layers' switch to the Triton kernels, run on CPU through Triton's interpreter: with
the switch forced on, every kernel is launched and the model's logits and greedy tokens are those
of the torch path. (On CUDA the switch is on by itself; the gpu tier checks it against
transformers.)"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.kernels.kernel_cases import interpreter_only

pytestmark = interpreter_only
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 130, 64, 11, 200, 19, 88, 301, 6, 45]
DENSE = {"rms_norm", "fused_add_rms_norm", "qk_norm_rope_", "silu_and_mul"}
SPARSE = DENSE | {"topk_softmax", "fused_moe"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from radixserve.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("dispatch")
    return {a: write_tiny_checkpoint(a, root / a) for a in ("llama3", "qwen3", "qwen3_moe")}


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Force the Triton path for CPU tensors; count each kernel launcher's calls."""
    from radixserve.engine import sampler
    from radixserve.kvcache import pool
    from radixserve.layers import activation, moe, norm, rotary
    from radixserve.utils import kernel_path

    calls: collections.Counter = collections.Counter()

    def counted(name: str, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module, names in [
        (norm, ["rms_norm", "fused_add_rms_norm"]), (activation, ["silu_and_mul"]),
        (rotary, ["qk_norm_rope_"]), (pool, ["store_kv"]), (moe, ["topk_softmax"]),
        (sampler, ["argmax_rows"]),
    ]:
        for name in names:
            monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    monkeypatch.setitem(moe.MOE_BACKENDS._items, "triton",
                        counted("fused_moe", moe.MOE_BACKENDS.get("triton")))
    monkeypatch.setattr(kernel_path, "use_triton", lambda t: True)
    yield calls


def test_cpu_tensors_take_the_torch_path_even_when_interpreting() -> None:
    import os

    from radixserve.utils import kernel_path

    assert os.environ.get("TRITON_INTERPRET") == "1"  # set process-wide by this folder's conftest
    assert not kernel_path.use_triton(torch.zeros(1))


@torch.inference_mode()
def pooled_logits(model, ids: list[int], kv_dtype: torch.dtype = torch.float32):
    """(logits, KV pool) of one prefill through the torch backend and a real KV pool, which the
    kernel path fills from the rotary kernel and the torch path through `pool.store_kv`. An FP8
    pool gets a K and a V scale per layer, all different."""
    from tests.models.helpers import one_request_batch

    from radixserve.attention.base import AttnConfig
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.core.context import forward_batch
    from radixserve.kvcache.pool import MHAKVPool
    from radixserve.models import hf_config as hc

    cfg, n = model.hf_config, len(ids)
    hq, hk, d = cfg.num_attention_heads, hc.num_kv_heads(cfg), hc.head_dim(cfg)
    layers = cfg.num_hidden_layers
    scales = {} if kv_dtype != torch.float8_e4m3fn else {
        "k_scales": [0.05 * (i + 1) for i in range(layers)],
        "v_scales": [0.5 / (i + 1) for i in range(layers)],
    }
    pool = MHAKVPool(layers, n + 3, 1, hk, d, kv_dtype, "cpu", **scales)
    table = torch.zeros(1, n, dtype=torch.int32)
    table[0] = torch.randperm(n + 3, generator=torch.Generator().manual_seed(n))[:n]
    batch = dataclasses.replace(one_request_batch(ids), out_loc=table[0].long())
    backend = TorchBackend(AttnConfig(hq, hk, d, 1, pool, table, torch.device("cpu"), torch.float32))
    backend.prepare(batch)
    with forward_batch(batch, backend):
        hidden = model(batch.input_ids, batch.positions)
    return model.compute_logits(hidden), pool


@pytest.mark.parametrize("arch", ["llama3", "qwen3", "qwen3_moe"])
def test_model_logits_through_kernels_match_torch_path(ckpts, arch, request) -> None:
    from radixserve.models.loader import load_model

    model, _ = load_model(ckpts[arch], torch.float32, "cpu")
    want, want_pool = pooled_logits(model, PROMPT)
    calls = request.getfixturevalue("kernels_on")
    got, got_pool = pooled_logits(model, PROMPT)
    expected = SPARSE if arch == "qwen3_moe" else DENSE
    assert {n for n, c in calls.items() if c} == expected
    # one rotary per layer, which also does qwen3's per-head q/k norms and stores k/v in the
    # pool (so no store_kv launch); every other norm but the first layer's input norm carries
    # the residual add
    layers = model.hf_config.num_hidden_layers
    assert calls["qk_norm_rope_"] == layers and calls["store_kv"] == 0
    assert calls["rms_norm"] == 1
    torch.testing.assert_close(got_pool._kv, want_pool._kv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_model_logits_through_kernels_match_torch_path_fp8_kv(ckpts, request) -> None:
    """The fused rotary kernel quantizes k/v into an FP8 pool exactly as `pool.store_kv`'s torch
    path does (bit for bit), so the logits read back from it agree too."""
    from radixserve.models.loader import load_model

    fp8 = torch.float8_e4m3fn
    model, _ = load_model(ckpts["qwen3"], torch.float32, "cpu")
    want, want_pool = pooled_logits(model, PROMPT, fp8)
    calls = request.getfixturevalue("kernels_on")
    got, got_pool = pooled_logits(model, PROMPT, fp8)
    assert calls["qk_norm_rope_"] == model.hf_config.num_hidden_layers
    assert got_pool.dtype == fp8 and got_pool._kv.view(torch.uint8).any()
    assert torch.equal(got_pool._kv.view(torch.uint8), want_pool._kv.view(torch.uint8))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    exact, _ = pooled_logits(model, PROMPT)  # the float32 pool: FP8 is close, not equal
    assert 0 < (got - exact).abs().max() < 0.1 * exact.abs().max()


@torch.inference_mode()
def prefill_then_decode(model, backend_cls, ids: list[int]):
    """(logits, KV pool) of one decode step after a prefill of `ids[:-1]` (torch backend), the
    decode step through `backend_cls` on a real pool with shuffled slots."""
    from tests.models.helpers import one_request_batch

    from radixserve.attention.base import AttnConfig
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.core.batch import Batch
    from radixserve.core.context import forward_batch
    from radixserve.kvcache.pool import MHAKVPool
    from radixserve.models import hf_config as hc

    cfg, n = model.hf_config, len(ids) - 1
    hq, hk, d = cfg.num_attention_heads, hc.num_kv_heads(cfg), hc.head_dim(cfg)
    pool = MHAKVPool(cfg.num_hidden_layers, n + 4, 1, hk, d, torch.float32, "cpu")
    table = torch.zeros(1, n + 1, dtype=torch.int32)
    table[0] = torch.randperm(n + 4, generator=torch.Generator().manual_seed(n))[: n + 1]
    attn = AttnConfig(hq, hk, d, 1, pool, table, torch.device("cpu"), torch.float32)
    prefill = dataclasses.replace(one_request_batch(ids[:n]), out_loc=table[0, :n].long())
    decode = Batch("decode", torch.tensor(ids[n:]), torch.tensor([n]), table[0, n:].long(),
                   torch.zeros(1, dtype=torch.int64), torch.tensor([n + 1], dtype=torch.int32),
                   torch.ones(1, dtype=torch.int32), [n + 1], [1])
    for batch, backend in ((prefill, TorchBackend(attn)), (decode, backend_cls(attn))):
        backend.prepare(batch)
        with forward_batch(batch, backend):
            hidden = model(batch.input_ids, batch.positions)
    return model.compute_logits(hidden), pool


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_decode_kernel_rotates_and_stores_the_new_token(tmp_path, arch, request) -> None:
    """A decode step through the Triton backend: its decode kernel takes q/k as the projection
    leaves them and norms, rotates and stores the new token itself, so the step launches no
    rotary kernel, and its logits and KV pool are the torch path's."""
    from radixserve.attention.torch_backend import TorchBackend
    from radixserve.attention.triton_backend import TritonBackend
    from radixserve.models.loader import load_model
    from radixserve.testing import write_tiny_checkpoint

    model, _ = load_model(write_tiny_checkpoint(arch, tmp_path, head_dim=32), torch.float32, "cpu")
    want, want_pool = prefill_then_decode(model, TorchBackend, PROMPT)
    calls = request.getfixturevalue("kernels_on")
    got, got_pool = prefill_then_decode(model, TritonBackend, PROMPT)
    assert calls["qk_norm_rope_"] == model.hf_config.num_hidden_layers  # the prefill's only
    torch.testing.assert_close(got_pool._kv, want_pool._kv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rotary_layer_stores_kv_alike_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """`RotaryEmbedding` with a KV destination: the kernel (in place, one launch) and the torch
    path give the same q, k and caches; cache rows outside out_loc stay as they were."""
    from types import SimpleNamespace

    from radixserve.layers.attention import KVDestination
    from radixserve.layers.norm import RMSNorm
    from radixserve.layers.rotary import RotaryEmbedding
    from radixserve.utils import kernel_path

    gen = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(SimpleNamespace(rope_theta=1e4, rope_scaling=None), 16, 64)
    q_norm, k_norm = RMSNorm(16, 1e-6), RMSNorm(16, 1e-6)
    for norm in (q_norm, k_norm):
        norm.weight.data = 1 + 0.3 * torch.randn(16, generator=gen)
    qkv = torch.randn(5, (4 + 2 * 2) * 16, generator=gen)
    pos, loc = torch.tensor([0, 3, 9, 63, 17]), torch.tensor([11, 2, 7, 0, 5])
    caches = torch.randn(1, 2, 12, 2, 16, generator=gen).repeat(2, 1, 1, 1, 1)  # [path, k|v, slot, ...]
    before = caches.clone()
    outs = []
    for path, triton in enumerate((False, True)):
        monkeypatch.setattr(kernel_path, "use_triton", lambda t, on=triton: on)
        q, k, v = qkv.clone().split([64, 32, 32], dim=1)
        dest = KVDestination(caches[path, 0], caches[path, 1], loc)
        outs.append(rope(pos, q, k, q_norm, k_norm, v, dest))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1], caches[0], rtol=1e-5, atol=1e-5)
    k_want = outs[0][1].view(5, 2, 16)
    assert torch.equal(caches[0, 0, loc], k_want)
    assert torch.equal(caches[:, 1, loc], qkv[:, 96:].view(1, 5, 2, 16).expand(2, -1, -1, -1))
    others = torch.ones(12, dtype=torch.bool)
    others[loc] = False
    assert torch.equal(caches[:, :, others], before[:, :, others])


def test_pool_store_kv_through_kernel_matches_torch_path(kernels_on) -> None:
    from radixserve.kvcache.pool import MHAKVPool

    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(5, 4, 8, generator=gen)  # k and v as strided views of one tensor
    k, v, loc = kv[:, :2], kv[:, 2:], torch.tensor([9, 0, 4, 15, 3])
    pools = [MHAKVPool(2, 4, 4, 2, 8, torch.float32, "cpu") for _ in range(2)]
    pools[0].store_kv(k, v, loc, layer_id=1)
    assert kernels_on["store_kv"] == 1
    pools[1].k_cache(1)[loc] = k
    pools[1].v_cache(1)[loc] = v
    assert torch.equal(pools[0]._kv, pools[1]._kv)
    assert pools[0].k_cache(0).abs().sum() == 0  # other layers untouched


def test_greedy_tokens_through_kernels_match_torch_path(ckpts, request) -> None:
    """The whole engine on CPU (torch attention backend; the rotary kernel stores KV, not
    `pool.store_kv`), prefill in chunks then decode: the same tokens with the kernels as without,
    greedy tokens picked by the Triton argmax once per step that emits tokens."""
    from radixserve import LLM, SamplingParams

    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    prompts = [PROMPT[:9], PROMPT[:4]]

    def run() -> list[list[int]]:
        llm = LLM(str(ckpts["qwen3_moe"]), dtype="float32", device="cpu", page_size=4,
                  max_prefill_length=8, max_running_requests=4)
        return [r.token_ids for r in llm.generate(prompts, sp)]

    want = run()
    calls = request.getfixturevalue("kernels_on")
    assert run() == want
    assert calls["store_kv"] == 0 and calls["qk_norm_rope_"] > 0 and calls["fused_moe"] > 0
    assert calls["argmax_rows"] >= 3  # the 3 tokens of the longer prompt, at least


def test_linear_streams_few_16bit_rows_through_the_skinny_kernel(monkeypatch) -> None:
    """Decode-sized 16-bit batches take the skinny kernel (same result as F.linear); larger
    batches and float32 (the parity reference) stay on F.linear."""
    from radixserve.layers import linear as lin
    from radixserve.utils import kernel_path

    rows_seen: list[int] = []
    skinny = lin.skinny_gemm

    def counted(x, w, b):
        rows_seen.append(x.shape[0])
        return skinny(x, w, b)

    monkeypatch.setattr(lin, "skinny_gemm", counted)
    monkeypatch.setattr(kernel_path, "use_triton", lambda t: True)
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(24, 40, generator=gen) / 6).half()
    b = torch.randn(24, generator=gen).half()
    for m, dtype in [(1, torch.float16), (16, torch.float16), (17, torch.float16), (3, torch.float32)]:
        x = torch.randn(m, 40, generator=gen).to(dtype)
        got = lin.linear(x, w.to(dtype), b.to(dtype))
        want = torch.nn.functional.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    assert rows_seen == [1, 16]


@pytest.mark.parametrize("bias", [False, True])
def test_linear_into_a_buffer_equals_f_linear(bias: bool) -> None:
    """`out` (a prefill graph's static qkv buffer): the same product, written there."""
    from radixserve.layers import linear as lin

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(33, 40, generator=gen), torch.randn(24, 40, generator=gen)
    b = torch.randn(24, generator=gen) if bias else None
    buf = torch.full((33, 24), 9.0)
    got = lin.linear(x, w, b, out=buf)
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(buf, torch.nn.functional.linear(x, w, b))


def test_dense_mlp_fuses_silu_into_the_down_projection_for_one_16bit_row(monkeypatch) -> None:
    """One 16-bit row (decode at batch 1) computes silu(gate) * up inside the down projection's
    launch, with the bits of the two launches it replaces; more rows, float32 and another
    activation keep the separate launch."""
    from radixserve.layers import linear as lin
    from radixserve.layers.activation import GeluTanhAndMul
    from radixserve.models.decoder import DenseMLP
    from radixserve.utils import kernel_path

    fused: list[int] = []
    gemv = lin.silu_mul_gemv
    monkeypatch.setattr(lin, "silu_mul_gemv", lambda x, w, b: fused.append(x.shape[0]) or gemv(x, w, b))
    gen = torch.Generator().manual_seed(5)
    mlp = DenseMLP(40, 72)
    for p in mlp.parameters():
        p.data = torch.randn(p.shape, generator=gen) / 6
    # float16 where rows > 1: the interpreter does not emulate a bf16 tl.dot (the skinny kernel's)
    cases = [(1, torch.bfloat16, True), (1, torch.float16, True), (2, torch.float16, False),
             (1, torch.float32, False)]
    for rows, dtype, fuses in cases:
        mlp.to(dtype)
        x = torch.randn(rows, 40, generator=gen).to(dtype)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(x)))  # torch path: unfused
        with monkeypatch.context() as m:
            m.setattr(kernel_path, "use_triton", lambda t: True)
            unfused = mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(x)))
            got = mlp(x)
        assert fused == ([1] if fuses else []), (rows, dtype)
        assert torch.equal(got, unfused)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        fused.clear()
    mlp.act_fn = GeluTanhAndMul()
    with monkeypatch.context() as m:
        m.setattr(kernel_path, "use_triton", lambda t: True)
        mlp.to(torch.bfloat16)(torch.randn(1, 40, generator=gen).bfloat16())
    assert fused == []


def test_block_scales_compact_only_over_rows_that_share_them(monkeypatch) -> None:
    """A block-FP8 layer keeps one row of scales per aligned group of rows that share them (16 or
    more): 128 for whole blocks, 64 where a piece starts mid-block, none for an 8-row piece. The
    one-row kernel over the compact scales (one scale a program) gives the per-row layer's result
    up to float32 rounding, and the reference path the same bits."""
    from radixserve.layers.fp8_linear import compact_block_scales, to_fp8_linear
    from radixserve.layers.linear import ReplicatedLinear
    from radixserve.utils import kernel_path

    gen = torch.Generator().manual_seed(8)

    def blocks(*counts: int) -> torch.Tensor:  # rows of consecutive pieces, each its own scales
        return torch.cat([(torch.rand(1, 3, generator=gen) + 0.5).expand(c, 3) for c in counts])

    for rows_of, want in [((128, 128), 128), ((64, 128, 64), 64), ((8, 120, 128), 1)]:
        layer = ReplicatedLinear(300, 256, bias=False)
        to_fp8_linear(layer, block_k=128)
        layer.weight.data = (torch.randn(256, 300, generator=gen) * 64).clamp(-448, 448).to(
            layer.weight.dtype)
        layer.weight_scale.data = blocks(*rows_of) / 256
        per_row = layer.weight_scale.clone()
        x = torch.randn(1, 300, generator=gen).to(torch.float16)
        ref_before = layer(x)  # CPU path: the torch reference
        with monkeypatch.context() as m:
            m.setattr(kernel_path, "use_triton", lambda t: True)
            before = layer(x)
            assert compact_block_scales(layer) == want == layer.scale_block_n
            after = layer(x)
        assert layer.weight_scale.shape == (-(-256 // want), 3)
        assert torch.equal(layer.weight_scale.repeat_interleave(want, 0)[:256], per_row)
        torch.testing.assert_close(after, before, rtol=2e-3, atol=2e-3)
        assert torch.equal(layer(x), ref_before)
        assert compact_block_scales(layer) == want  # once only


def test_lora_rides_the_one_row_gemv(monkeypatch) -> None:
    """One 16-bit row with adapters (decode at batch 1): each projection takes the shrink and
    one GEMV with the expand in its epilogue, the down projection's activation inside both,
    with the torch path's result for a mixed slot, the base model (slot -1) and an empty slot;
    two rows keep the product, then the shrink and the expand."""
    from types import SimpleNamespace

    from radixserve.core import context
    from radixserve.layers import lora as lora_layer
    from radixserve.layers.linear import QKVParallelLinear
    from radixserve.layers.lora import LinearLoRA
    from radixserve.models.decoder import DenseMLP
    from radixserve.utils import kernel_path
    from radixserve_kernels import lora_groups

    fused: list[bool] = []
    gemv = lora_layer.lora_gemv
    monkeypatch.setattr(lora_layer, "lora_gemv",
                        lambda *a, **k: fused.append(a[7]) or gemv(*a, **k))
    gen = torch.Generator().manual_seed(6)
    dtype, slots, rank = torch.float16, 3, 4
    mlp, qkv = DenseMLP(40, 72), QKVParallelLinear(40, 8, 4, 2, bias=True)
    layers = [qkv, mlp.gate_up_proj, mlp.down_proj]
    for p in [*mlp.parameters(), *qkv.parameters()]:
        p.data = (torch.randn(p.shape, generator=gen) / 6).to(dtype)
    for layer in layers:
        layer.lora = LinearLoRA(layer, slots, rank, dtype)
        layer.lora.a.copy_(torch.randn(layer.lora.a.shape, generator=gen) / 6)
        layer.lora.b.copy_(torch.randn(layer.lora.b.shape, generator=gen) / 4)
        layer.lora.clear(2)  # an empty slot

    def run(x: torch.Tensor, token_slots: list[int], kernels: bool) -> list[torch.Tensor]:
        groups = lora_groups(torch.tensor(token_slots, dtype=torch.int32), slots)
        with monkeypatch.context() as m:
            m.setattr(context.get_context(), "batch", SimpleNamespace(lora=groups))
            if kernels:
                m.setattr(kernel_path, "use_triton", lambda t: True)
            return [qkv(x), mlp(x)]

    for token_slots in ([1], [-1], [2], [0, 1]):
        x = torch.randn(len(token_slots), 40, generator=gen).to(dtype)
        got, want = run(x, token_slots, True), run(x, token_slots, False)
        # one row: qkv, gate-up and the gated down projection each fused
        assert fused == ([False, False, True] if len(token_slots) == 1 else []), token_slots
        for g, w in zip(got, want):
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
        fused.clear()
    # the update is there: without adapters the outputs differ
    x = torch.randn(1, 40, generator=gen).to(dtype)
    assert not torch.allclose(run(x, [1], True)[1].float(), run(x, [-1], True)[1].float(), atol=0.05)
